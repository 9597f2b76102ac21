"""`python -m podsys.health.run <check> [options]`: run one probe on this node and print its
one `OGAI-HEALTH-RESULT {json}` line.

Exit 0 when it measured something, even if the node is bad (the line says so); 2 when it could
not measure (the line carries the reason); 3 when the probe itself broke. No Django here: this
runs inside the check's workload, on the node.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from podsys.health import probes
from podsys.health.result import format_result, not_run

COULD_NOT_RUN = 2
PROBE_BROKE = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m podsys.health.run",
                                     description="Run one OGAI health probe on this node.")
    checks = parser.add_subparsers(dest="check", required=True)

    def gpu_check(name: str) -> argparse.ArgumentParser:
        sub = checks.add_parser(name)
        sub.add_argument("--expect-gpus", type=int, required=True,
                         help="how many GPUs this node must have (0: none expected)")
        return sub

    gpu_check("gpu-presence")
    gpu_check("driver-version").add_argument(
        "--expect-driver", default="", help="the driver version the node must run ('' any)")
    gpu_check("remapped-rows")
    gpu_check("power-slowdown")
    gpu_check("pcie-bandwidth").add_argument("--size-mib", type=int, default=256)
    dcgm = gpu_check("dcgm-diag")
    dcgm.add_argument("--level", type=int, default=1, choices=(1, 2, 3, 4))
    dcgm.add_argument("--timeout-s", type=float, default=540)
    nccl = checks.add_parser("nccl-allreduce")
    nccl.add_argument("--size-mib", type=int, default=64)
    nccl.add_argument("--iterations", type=int, default=10)
    nccl.add_argument("--min-busbw-gbps", type=float, default=0.0)
    nccl.add_argument("--timeout-s", type=float, default=300)
    net = checks.add_parser("network")
    net.add_argument("--target", action="append", default=[],
                     help="another node's host:port, repeatable")
    net.add_argument("--platform", default="", help="the platform's host:port ('' none)")
    net.add_argument("--timeout-s", type=float, default=3.0)
    return parser


def _probe(args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    check = args.check
    if check == "gpu-presence":
        return lambda: probes.gpu_presence(expect_gpus=args.expect_gpus)
    if check == "driver-version":
        return lambda: probes.driver_version(expect_driver=args.expect_driver,
                                             expect_gpus=args.expect_gpus)
    if check == "remapped-rows":
        return lambda: probes.remapped_rows(expect_gpus=args.expect_gpus)
    if check == "power-slowdown":
        return lambda: probes.power_slowdown(expect_gpus=args.expect_gpus)
    if check == "pcie-bandwidth":
        return lambda: probes.pcie_bandwidth(expect_gpus=args.expect_gpus,
                                             size_mib=args.size_mib)
    if check == "dcgm-diag":
        return lambda: probes.dcgm_diag(expect_gpus=args.expect_gpus, level=args.level,
                                        timeout_s=args.timeout_s)
    if check == "nccl-allreduce":
        return lambda: probes.nccl_allreduce(size_mib=args.size_mib,
                                             iterations=args.iterations,
                                             min_busbw_gbps=args.min_busbw_gbps,
                                             timeout_s=args.timeout_s)
    return lambda: probes.network(targets=args.target, platform=args.platform,
                                  timeout_s=args.timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code = 0
    try:
        result = _probe(args)()
    except probes.ProbeError as exc:
        result, code = not_run(args.check, str(exc)), COULD_NOT_RUN
    except Exception as exc:  # a bug or an odd machine: still one readable line
        result, code = not_run(args.check, f"the probe broke: {type(exc).__name__}: {exc}"), \
            PROBE_BROKE
    print(format_result(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
