"""``singerlake spark start|stop|status``: the machine's warm Spark, a local Spark Connect server that
runs with $SINGERLAKE_SPARK_WARM=true attach to (``singerlake.spark.warm``)."""

from __future__ import annotations

import argparse

from singerlake.cli.output import Output

HELP = "the warm Spark of this machine: start, stop or status (runs use it with $SINGERLAKE_SPARK_WARM=true)"


def add_spark_command(sub) -> None:
    cmd = sub.add_parser("spark", help=HELP, description=HELP + "; status exits 1 when it is not running")
    cmd.add_argument("action", choices=("start", "stop", "status"))
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="start: a setting of the server (repeatable)")
    cmd.set_defaults(run=cmd_spark)


def cmd_spark(args: argparse.Namespace, output: Output) -> int:
    from singerlake.cli.lakes import check_spark_installed
    from singerlake.spark import warm
    from singerlake.spark.session import driver_options

    conf = check_spark_installed(args)
    if args.action == "start":
        warm.remote_url("local[*]", lambda: driver_options("local[*]", conf))
    elif args.action == "stop":
        pid = warm.stop()
        output.result({"stopped": pid}, f"stopped the warm Spark (pid {pid})" if pid else "no warm Spark was running")
        return 0
    state = warm.status()
    if state is None:
        output.result({"running": False}, "warm Spark: not running")
        return 1
    memory = f"{state['rss_mib']:,.0f} MiB" if state["rss_mib"] is not None else "unknown"
    text = (
        f"warm Spark: running at {state['url']}, pid {state['pid']}, Spark {state['spark_version']}, JVM memory {memory}, "
        f"idle {state['idle_s']:.0f} s"
    )
    minutes = state["idle_stop_minutes"]
    text += f" (stops after {minutes:g} min idle)" if minutes else " (no idle stop: `singerlake spark stop` ends it)"
    output.result({"running": True, **state}, text)
    return 0
