# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU faults read from NVIDIA dcgm-exporter's /metrics text (private to gpufleet.serving).

Standard library only: the engine watchdog copies this file onto the host and imports it with
plain python3, so nothing here may import Ansible or a Prometheus client. Python 3.9+.

What dcgm-exporter prints (captured outputs in tests/fixtures/dcgm/, field list in its README):
one sample per GPU, or per MIG instance of a GPU, with the GPU index in the ``gpu`` label;
``DCGM_FI_DEV_XID_ERRORS`` holds the code of the LAST Xid the driver raised on that GPU (0 = none;
it does not go back to 0 when the GPU recovers); ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` counts
uncorrectable (double-bit) ECC errors since the driver loaded (not in the default counter set);
``DCGM_FI_DEV_ROW_REMAP_FAILURE`` is 1 once the GPU could not remap a failing memory row.
"""

from __future__ import annotations

import math
import re

# Xid codes after which a GPU is taken out of service until it is reset or replaced. Sources
# (tests/fixtures/dcgm/README.md has one line per code): NVIDIA's Xid catalog
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), NVIDIA Health Validation's Xid
# checks (docs.nvidia.com/health-validation/reference/checks/xid.md: 46 and 48 are "CRITICAL,
# drain: reset_gpu"), NVIDIA's GPU memory error management guide
# (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/), names as in NVIDIA/dcgm-exporter
# internal/pkg/collector/xid_errors.go. Left out on purpose: the application errors that the NVIDIA
# k8s-device-plugin ignores (13, 31, 43, 45, 68, 109: internal/rm/health.go), 63 (a row remap is
# pending; work may go on until the next reset) and 92 (a rising single-bit rate, a trend to watch).
DRAIN_XIDS = (46, 48, 62, 64, 74, 79, 94, 95, 119, 120, 140, 143, 154, 171, 172)

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
# dcgm-exporter's optional per-Xid counter (DCGM_EXP_XID_ERRORS_COUNT{xid="79"} N: Xids seen in its
# window); unlike the last-Xid gauge, a later harmless Xid does not hide a fatal one.
XID_COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"
# Volatile only: the aggregate counter (..._DBE_AGG_TOTAL) survives reboots and would keep a
# repaired GPU out of service for ever.
DBE_METRICS = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",)
ROW_REMAP_FAILURE_METRIC = "DCGM_FI_DEV_ROW_REMAP_FAILURE"

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class _BadValue(ValueError):
    """A sample whose name and labels parse but whose value does not."""


def _parse_labels(line: str, pos: int) -> tuple[dict, int]:
    """Read ``{name="value",...}`` starting at ``line[pos] == "{"``; returns (labels, end)."""
    labels = {}
    pos += 1
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if line.startswith("}", pos):
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match:
            raise ValueError("expected a label name at column %d" % (pos + 1))
        name, pos = match.group(), match.end()
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if not line.startswith('="', pos):
            raise ValueError('expected =" after label %s' % name)
        pos += 2
        value = []
        while True:
            if pos >= len(line):
                raise ValueError("unterminated value of label %s" % name)
            char = line[pos]
            if char == '"':
                pos += 1
                break
            if char == "\\":
                escaped = _ESCAPES.get(line[pos + 1 : pos + 2])
                if escaped is None:
                    raise ValueError("bad escape in label %s" % name)
                value.append(escaped)
                pos += 2
                continue
            value.append(char)
            pos += 1
        labels[name] = "".join(value)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if line.startswith(",", pos):
            pos += 1
        elif not line.startswith("}", pos):
            raise ValueError("expected , or } after label %s" % name)


def _parse_value(text: str) -> float:
    """A sample value: a float, NaN or [+-]Inf, optionally followed by an integer timestamp."""
    fields = text.split()
    if not 1 <= len(fields) <= 2 or "_" in text:
        raise _BadValue("expected a value and an optional timestamp, got %r" % text)
    try:
        value = float(fields[0])
        if len(fields) == 2:
            int(fields[1])
    except ValueError:
        raise _BadValue("expected a value and an optional timestamp, got %r" % text) from None
    return value


def parse_metrics(text: str, skip_bad_values: bool = False) -> list:
    """Parse Prometheus text exposition format into ``[(name, labels, value), ...]``.

    Comment, ``# HELP`` / ``# TYPE`` and blank lines are skipped. Label values may hold the
    escapes \\\\, \\" and \\n; values may be NaN, +Inf or -Inf; a timestamp after the value is
    read and dropped. A malformed line raises ValueError naming its line number.

    ``skip_bad_values=True`` skips, instead of raising on, a sample whose name and labels are well
    formed but whose value is not a number: real dcgm-exporter 3.x output holds such lines
    (``... ERROR - FAILED TO CONVERT TO STRING``) for fields it cannot render, and one broken
    field must not hide the others. Anything else malformed (an HTML error page) still raises.
    """
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            match = _NAME.match(line)
            if not match:
                raise ValueError("expected a metric name")
            labels, pos = {}, match.end()
            if line.startswith("{", pos):
                labels, pos = _parse_labels(line, pos)
            if pos < len(line) and line[pos] not in " \t":
                raise ValueError("expected a space after the metric name or labels")
            value = _parse_value(line[pos:])
        except _BadValue as err:
            if skip_bad_values:
                continue
            raise ValueError("line %d: %s: %s" % (number, err, raw[:120])) from None
        except ValueError as err:
            raise ValueError("line %d: %s: %s" % (number, err, raw[:120])) from None
        samples.append((match.group(), labels, value))
    return samples


def _gpu_index(labels: dict):
    """The ``gpu`` label as an int, or None when absent or not a number."""
    try:
        return int(labels["gpu"])
    except (KeyError, ValueError):
        return None


def gpus_seen(text: str) -> list:
    """Sorted GPU indices with at least one sample in ``text`` (a GPU missing here has fallen off)."""
    found = {_gpu_index(sample[1]) for sample in parse_metrics(text, skip_bad_values=True)}
    return sorted(found - {None})


def gpu_faults(text: str, gpus=None, drain_xids=DRAIN_XIDS) -> list:
    """Drain-worthy faults in dcgm-exporter ``text``, for the GPU indices ``gpus`` (None: all).

    Returns ``[{"gpu": int, "reason": str, "detail": str}, ...]`` sorted by gpu then reason, one
    entry per GPU and reason even when MIG instances repeat a series. Reasons:
    ``xid_<code>`` when the GPU's last Xid (or a per-Xid count above 0) is in ``drain_xids``;
    ``ecc_dbe`` when a volatile uncorrectable ECC counter is above 0; ``row_remap_failure`` when
    the GPU failed to remap a memory row. A GPU that is absent from ``text`` is not reported
    here: compare ``gpus_seen`` with the GPUs you expect.
    """
    wanted = None if gpus is None else {int(gpu) for gpu in gpus}
    drain = {int(code) for code in drain_xids}
    found = {}
    for name, labels, value in parse_metrics(text, skip_bad_values=True):
        gpu = _gpu_index(labels)
        if gpu is None or (wanted is not None and gpu not in wanted) or not math.isfinite(value):
            continue
        if name == XID_METRIC and int(value) in drain:
            reason = "xid_%d" % int(value)
            detail = "%s=%d (the last Xid seen)" % (name, int(value))
            if labels.get("err_msg"):
                detail += ": %s" % labels["err_msg"]
        elif name == XID_COUNT_METRIC and value > 0 and labels.get("xid", "").isdigit() and int(labels["xid"]) in drain:
            reason = "xid_%d" % int(labels["xid"])
            detail = "%s{xid=%s}=%g" % (name, labels["xid"], value)
        elif name in DBE_METRICS and value > 0:
            reason, detail = "ecc_dbe", "%s=%g" % (name, value)
        elif name == ROW_REMAP_FAILURE_METRIC and value > 0:
            reason, detail = "row_remap_failure", "%s=%g" % (name, value)
        else:
            continue
        found.setdefault((gpu, reason), detail)
    return [{"gpu": gpu, "reason": reason, "detail": found[gpu, reason]} for gpu, reason in sorted(found)]
