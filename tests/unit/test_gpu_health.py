"""GPU faults from dcgm-exporter /metrics, on REAL captures, and the lab's dcgm-exporter stand-in.

tests/fixtures/dcgm/ holds the captures (their '# gpufleet fixture:' lines name the source). Faults
are made by editing a capture's values the way the stand-in does, or by the stand-in itself.
"""

from __future__ import annotations

import math
import re
import signal
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, fetch

from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_health import (
    DRAIN_XIDS,
    gpu_faults,
    gpus_seen,
    parse_metrics,
)

DCGM = ROOT / "tests" / "fixtures" / "dcgm"
STANDIN = ROOT / "tests" / "lab" / "dcgm-exporter-standin"
A800 = DCGM / "8x_a800_sxm4_80gb_mig.txt"
RTX4000 = DCGM / "1x_rtx4000_ada_k8s.txt"
UNRENDERED = "ERROR - FAILED TO CONVERT TO STRING"


def capture(path):
    return path.read_text()


def sample_lines(text):
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def set_value(text, metric, gpu, value):
    """The capture with every `metric` sample of `gpu` set to `value` (MIG instances included)."""
    pattern = re.compile(r'^(%s\{gpu="%d",.*\}) \S+$' % (metric, gpu), re.M)
    changed, count = pattern.subn(lambda m: "%s %s" % (m.group(1), value), text)
    assert count, "no %s sample for gpu %d" % (metric, gpu)
    return changed


def test_drain_xids_sorted_and_leave_application_errors_out():
    assert list(DRAIN_XIDS) == sorted(set(DRAIN_XIDS))
    assert {48, 79, 95}.issubset(DRAIN_XIDS)
    assert not {13, 31, 43, 45, 68, 109} & set(DRAIN_XIDS)


@pytest.mark.parametrize("path", [A800, RTX4000])
def test_parse_counts_every_sample(path):
    text = capture(path)
    lines = sample_lines(text)
    samples = parse_metrics(text, skip_bad_values=True)
    assert len(samples) == len([line for line in lines if UNRENDERED not in line])
    names = {name for name, _, _ in samples}
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"} <= names
    assert all(isinstance(value, float) for _, _, value in samples)


def test_a800_capture_as_read_off_the_source():
    samples = parse_metrics(capture(A800), skip_bad_values=True)
    assert len(samples) == 223  # 17 families x 10 series + 9 families x 7 (no MIG GPU) - 10 unrendered
    temps = {
        (labels["gpu"], labels.get("GPU_I_ID")): value for name, labels, value in samples if name.endswith("GPU_TEMP")
    }
    assert temps[("0", "5")] == 33 and temps[("7", None)] == 29
    power = [v for n, labels, v in samples if n == "DCGM_FI_DEV_POWER_USAGE" and labels["gpu"] == "0"]
    assert power == [78.174, 78.174, 78.446]


def test_real_capture_holds_lines_a_strict_parser_rejects():
    with pytest.raises(ValueError, match=r"^line \d+: .*ERROR - FAILED TO CONVERT"):
        parse_metrics(capture(A800))


@pytest.mark.parametrize("path, expected", [(A800, list(range(8))), (RTX4000, [0])])
def test_healthy_captures(path, expected):
    text = capture(path)
    assert gpus_seen(text) == expected
    assert gpu_faults(text) == []
    assert gpu_faults(text, gpus=expected) == []


def test_xid_79_on_gpu_1_only_where_asked():
    text = set_value(capture(A800), "DCGM_FI_DEV_XID_ERRORS", 1, 79)
    faults = gpu_faults(text)
    assert [(f["gpu"], f["reason"]) for f in faults] == [(1, "xid_79")]
    assert "79" in faults[0]["detail"]
    assert gpu_faults(text, gpus=[0, 1]) == faults
    assert gpu_faults(text, gpus=[0, 2, 3]) == []


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xids_do_not_drain(code):
    assert gpu_faults(set_value(capture(A800), "DCGM_FI_DEV_XID_ERRORS", 3, code)) == []


def test_mig_gpu_reports_one_fault_not_one_per_instance():
    text = set_value(capture(A800), "DCGM_FI_DEV_XID_ERRORS", 0, 48)
    assert [(f["gpu"], f["reason"]) for f in gpu_faults(text)] == [(0, "xid_48")]


def test_xid_count_metric_and_custom_drain_list():
    text = capture(RTX4000) + 'DCGM_EXP_XID_ERRORS_COUNT{gpu="0",xid="79",window_size_in_ms="300000"} 2\n'
    assert [f["reason"] for f in gpu_faults(text)] == ["xid_79"]
    assert gpu_faults(text, drain_xids=(48,)) == []


def test_row_remap_failure_and_faults_sorted():
    text = set_value(capture(A800), "DCGM_FI_DEV_ROW_REMAP_FAILURE", 5, 1)
    text = set_value(text, "DCGM_FI_DEV_XID_ERRORS", 5, 95)
    text = set_value(text, "DCGM_FI_DEV_XID_ERRORS", 2, 79)
    assert [(f["gpu"], f["reason"]) for f in gpu_faults(text)] == [
        (2, "xid_79"),
        (5, "row_remap_failure"),
        (5, "xid_95"),
    ]


def test_dbe_counter_above_zero():
    dbe = 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="%d",UUID="GPU-x"} %d\n'
    text = capture(RTX4000) + dbe % (0, 0) + dbe % (1, 3)
    assert gpu_faults(text) == [{"gpu": 1, "reason": "ecc_dbe", "detail": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=3"}]
    assert gpu_faults(text, gpus=[0]) == []


def test_parse_escapes_specials_and_timestamps():
    text = (
        "# HELP x a\n\n"
        'x{a="q\\"uote",b="back\\\\slash",c="new\\nline",d="}{, "} 1.5 1700000000000\n'
        "y NaN\n"
        'z{gpu="0",} +Inf\n'
        "w -Inf -5\n"
    )
    samples = parse_metrics(text)
    assert samples[0] == ("x", {"a": 'q"uote', "b": "back\\slash", "c": "new\nline", "d": "}{, "}, 1.5)
    assert math.isnan(samples[1][2]) and samples[2][2] == math.inf and samples[3][2] == -math.inf
    assert samples[2][1] == {"gpu": "0"}


@pytest.mark.parametrize(
    "bad",
    [
        'x{a="1"',  # unterminated labels
        "x{a=1} 2",  # unquoted label value
        'x{a="\\q"} 2',  # unknown escape
        "x",  # no value
        "x 1 2 3",  # too many fields
        "<html>",  # not a sample at all
        "x 1_000",  # not a Prometheus number
    ],
)
def test_malformed_line_names_its_number(bad):
    with pytest.raises(ValueError, match=r"^line 3: "):
        parse_metrics("# ok\ngood 1\n%s\n" % bad)


def test_html_page_is_not_skipped_as_a_bad_value():
    with pytest.raises(ValueError, match="line 1"):
        gpu_faults("<html><body>502</body></html>\n")


# The stand-in, end to end.


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    return proc.returncode, out


def test_standin_serves_capture_injects_faults_and_stops_cleanly(standin):
    proc, port, fault_file = standin(A800)
    healthy = fetch(port)
    assert gpus_seen(healthy) == list(range(8)) and gpu_faults(healthy) == []
    assert "gpufleet fixture" not in healthy and UNRENDERED not in healthy
    parse_metrics(healthy)  # strict: a Prometheus server would accept it

    fault_file.write_text("xid 1 79\n")
    text = fetch(port)
    assert [(f["gpu"], f["reason"]) for f in gpu_faults(text)] == [(1, "xid_79")]
    assert gpu_faults(text, gpus=[2, 3]) == []

    fault_file.write_text("# GPU 0 and its MIG instances\necc_dbe 0 2\n")
    text = fetch(port)
    assert [(f["gpu"], f["reason"]) for f in gpu_faults(text)] == [(0, "ecc_dbe")]
    dbe = [labels for name, labels, _ in parse_metrics(text) if name == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]
    assert len(dbe) == 10  # one per series the capture has for XID: 3 MIG instances + 7 GPUs

    fault_file.write_text("gone 1\n")
    text = fetch(port)
    assert gpus_seen(text) == [0, 2, 3, 4, 5, 6, 7] and gpu_faults(text) == []
    fetch(port)  # same faults: no new log line

    fault_file.write_text("")
    assert fetch(port) == healthy

    with pytest.raises(urllib.error.HTTPError) as err:
        fetch(port, "/other")
    assert err.value.code == 404

    returncode, out = stop(proc)
    assert returncode == 0
    assert len([line for line in out.splitlines() if "faults:" in line]) == 5  # healthy, xid, dbe, gone, healthy


def test_standin_healthy_output_is_the_capture_and_labels_follow_xid(standin):
    proc, port, fault_file = standin(RTX4000)
    body = capture(RTX4000)
    assert fetch(port) == "".join(line for line in body.splitlines(keepends=True) if not line.startswith("# gpufleet"))
    fault_file.write_text("xid 0 95\n")
    xid = [labels for name, labels, _ in parse_metrics(fetch(port)) if name == "DCGM_FI_DEV_XID_ERRORS"]
    assert xid[0]["err_code"] == "95" and xid[0]["pod"] == "cuda-75454ffb9f-8ljq7"
    assert stop(proc)[0] == 0


def test_standin_healthy_baseline_zeroes_a_captured_xid(standin, tmp_path):
    dirty = tmp_path / "dirty.txt"
    dirty.write_text(set_value(capture(A800), "DCGM_FI_DEV_XID_ERRORS", 1, 79))
    assert gpu_faults(dirty.read_text()) != []
    proc, port, _ = standin(dirty, "--gpus", "2")
    text = fetch(port)
    assert gpus_seen(text) == [0, 1] and gpu_faults(text) == []
    assert stop(proc)[0] == 0
