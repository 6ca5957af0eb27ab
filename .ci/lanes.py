#!/usr/bin/env python3
"""Run test lanes side by side, print every lane's log readably, and the slowest tests of all.

    python3 .ci/lanes.py --dir .cache/lanes-test [--serial] NAME='COMMAND' NAME='COMMAND' ...

Each lane is one shell command (in the Makefile: ``$(MAKE) pytest-...``, a few joined with ``&&``
when they must follow each other). The first lane is streamed live; the others write to
``DIR/NAME.log``, each printed whole (between ``==`` lines) once the first lane is done, so the
processes' lines never interleave. Then the 15 slowest tests of every pytest process that wrote a
JUnit XML into DIR (``--junitxml=DIR/<name>.xml``; setup, call and teardown together, so a
module fixture's cost shows on its first test), and one line per lane: its exit and wall time.
Exit 0 when every lane exits 0, else the first failing lane's status. ``--serial``: one lane
after the other, all streamed (``PYTEST_SPLIT=0``). SIGINT/SIGTERM stop every lane's process
group and still print what the logs hold.

Standard library only: the host's Python 3.11+ runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import BinaryIO

SLOWEST = 15


@dataclass
class Lane:
    name: str
    command: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    start: float = 0.0
    end: float | None = None
    rc: int | None = None
    printed: bool = False
    waiter: threading.Thread | None = None

    def wall(self) -> str:
        secs = int((self.end or time.monotonic()) - self.start) if self.start else 0
        return f"{secs // 60}m{secs % 60:02d}s"


def parse(argv: list[str]) -> tuple[Path, bool, list[Lane]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="logs and JUnit XMLs (emptied first)")
    ap.add_argument("--serial", action="store_true", help="one lane after the other, all streamed")
    ap.add_argument("lanes", nargs="+", metavar="NAME=COMMAND")
    args = ap.parse_args(argv)
    lanes: list[Lane] = []
    for spec in args.lanes:
        name, sep, command = spec.partition("=")
        if not sep or not name or not command or not name.replace("-", "").isalnum():
            ap.error(f"lane {spec!r}: NAME=COMMAND, NAME letters, digits and '-'")
        if any(lane.name == name for lane in lanes):
            ap.error(f"lane {name!r} given twice")
        lanes.append(Lane(name, command, args.dir / f"{name}.log"))
    return args.dir, args.serial, lanes


def start(lane: Lane, live: bool) -> None:
    """Start the lane, and a thread that records its exit (and streams it, when ``live``)."""
    lane.start = time.monotonic()
    out = lane.log.open("wb")
    lane.proc = subprocess.Popen(
        ["bash", "-o", "pipefail", "-c", lane.command],
        stdout=subprocess.PIPE if live else out,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped as one on SIGTERM
    )
    if not live:
        out.close()
    lane.waiter = threading.Thread(target=follow, args=(lane, out if live else None), daemon=True)
    lane.waiter.start()


def follow(lane: Lane, out: BinaryIO | None) -> None:
    """Stream the live lane to stdout and its log; then record the exit and the time."""
    assert lane.proc is not None
    if out is not None and lane.proc.stdout is not None:
        pipe = lane.proc.stdout
        with pipe, out:
            # os.read: what is there now (pytest writes its progress dots without a newline)
            for chunk in iter(lambda: os.read(pipe.fileno(), 65536), b""):
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                out.write(chunk)
    lane.rc = lane.proc.wait()
    lane.end = time.monotonic()


def wait(lane: Lane) -> None:
    assert lane.waiter is not None
    lane.waiter.join()


def show(lane: Lane) -> None:
    if lane.printed:
        return
    lane.printed = True
    state = "still running (stopped)" if lane.rc is None else f"exit {lane.rc}"
    print(f"\n==== [{lane.name}] log ({state}, {lane.wall()}): {lane.command}", flush=True)
    if lane.log.is_file():
        with lane.log.open("rb") as fh:
            shutil.copyfileobj(fh, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    print(f"==== [{lane.name}] end of log", flush=True)


def slowest(folder: Path, n: int = SLOWEST) -> list[str]:
    """The n slowest test cases over every JUnit XML in ``folder``: ``seconds  process  test``."""
    cases: list[tuple[float, str, str]] = []
    for xml in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:
            continue  # a process killed while writing it
        for case in root.iter("testcase"):
            test = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
            test = test.replace("\n", "\\n")
            test = test if len(test) <= 140 else test[:137] + "..."
            cases.append((float(case.get("time") or 0.0), xml.stem, test))
    cases.sort(reverse=True)
    return [f"{secs:9.1f} s  {proc:<14} {test}" for secs, proc, test in cases[:n]]


def totals(folder: Path) -> tuple[int, int, int]:
    """Passed, failed (failures and errors) and skipped test cases over every JUnit XML in ``folder``."""
    passed = failed = skipped = 0
    for xml in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            tags = {child.tag for child in case}
            if tags & {"failure", "error"}:
                failed += 1
            elif "skipped" in tags:
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def report(folder: Path, lanes: list[Lane]) -> None:
    lines = slowest(folder)
    if lines:
        print(f"\n== the {len(lines)} slowest tests of all pytest processes (setup + call + teardown)")
        print("\n".join(lines))
    print("\n== lanes")
    for lane in lanes:
        state = "not finished" if lane.rc is None else f"exit {lane.rc}"
        print(f"  {lane.name:<14} {state:<13} {lane.wall():>8}  {lane.command}")
    passed, failed, skipped = totals(folder)
    # the plain closing line a CI reader counts, over every lane's pytest processes
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    folder, serial, lanes = parse(sys.argv[1:] if argv is None else argv)
    folder.mkdir(parents=True, exist_ok=True)
    for old in (*folder.glob("*.xml"), *folder.glob("*.log")):
        old.unlink()

    def stop(signum: int, _frame: FrameType | None) -> None:
        for lane in lanes:
            if lane.proc is not None and lane.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(lane.proc.pid, signal.SIGTERM)
        for lane in [] if serial else lanes[1:]:  # the streamed ones are on screen already
            show(lane)
        report(folder, lanes)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    if serial:
        for lane in lanes:
            print(f"\n==== [{lane.name}] {lane.command}", flush=True)
            start(lane, live=True)
            wait(lane)
            lane.printed = True
    else:
        print("== lanes side by side: " + "; ".join(f"[{x.name}] {x.command}" for x in lanes), flush=True)
        print(f"== [{lanes[0].name}] streams here; the others' logs follow it ({folder})", flush=True)
        for i, lane in enumerate(lanes):
            start(lane, live=i == 0)
        wait(lanes[0])
        print(f"\n== [{lanes[0].name}] done: exit {lanes[0].rc}, {lanes[0].wall()}", flush=True)
        # the others' logs, each as soon as it is done (those done already first, in their order)
        while pending := [x for x in lanes[1:] if not x.printed]:
            done = sorted((x for x in pending if x.end is not None), key=lambda x: x.end or 0.0)
            for lane in done:
                show(lane)
            if not done:
                time.sleep(1)
    report(folder, lanes)
    return next((lane.rc for lane in lanes if lane.rc), 0) or 0


if __name__ == "__main__":
    sys.exit(main())
