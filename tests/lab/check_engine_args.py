"""Feed engine command lines to the engine's OWN argument parser (run inside the engine image).

stdin: JSON {"engine": "vllm"|"sglang", "argvs": [[...], ...]}; stdout: JSON list with, per
command line, {"ok": bool, "error": str|null, "parsed": {...} (a few parsed values)}.
"""

import contextlib
import io
import json
import sys


def vllm_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # vLLM before the launchers package
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    parser = make_arg_parser(FlexibleArgumentParser())

    def parse(argv):
        args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
        keys = (
            "model",
            "port",
            "host",
            "tensor_parallel_size",
            "max_num_seqs",
            "pipeline_parallel_size",
            "nnodes",
            "node_rank",
            "master_addr",
            "master_port",
            "headless",
            "distributed_executor_backend",
        )
        return {k: getattr(args, k, None) for k in keys}

    return parse


def sglang_parser():
    from sglang.srt.server_args import prepare_server_args

    def parse(argv):
        args = prepare_server_args(argv)
        return {k: getattr(args, k, None) for k in ("model_path", "port", "host", "tp_size")}

    return parse


def main():
    request = json.load(sys.stdin)
    parse = vllm_parser() if request["engine"] == "vllm" else sglang_parser()
    results = []
    for argv in request["argvs"]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parsed = parse(argv)
            results.append({"ok": True, "error": None, "parsed": parsed})
        except SystemExit:
            results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:], "parsed": None})
        except Exception as exc:
            results.append({"ok": False, "error": repr(exc), "parsed": None})
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
