"""``verl-consistency run hybrid|fully-async|colocate-async``: one command per mode that launches a run.

It writes the run folder (msprobe configs, prompt set, reward function, ``run.json``), then
runs verl with the environment and overrides from :mod:`verl_consistency.entrypoints.run.overrides`, shows
where the run is, and ends with one summary line. Conflicting overrides are refused before
anything is written (exit code 2).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from verl_consistency.contracts import capture as capture_mod
from verl_consistency.contracts import env, layout, pins
from verl_consistency.contracts.env import DUMP_PHASE
from verl_consistency.contracts.run_manifest import MsprobeConfigs, RunManifest, now_utc
from verl_consistency.contracts.token_records import STEP_LOG, TOKEN_LOG
from verl_consistency.entrypoints.msprobe import config as mscfg
from verl_consistency.entrypoints.options import options_from
from verl_consistency.entrypoints.run import dataset
from verl_consistency.entrypoints.run.overrides import Mode, RunKind, Table
from verl_consistency.entrypoints.run.plan import RunPlan, build_plan
from verl_consistency.entrypoints.run.plan_options import (
    DEFAULT_MODEL,
    Device,
    PhaseChoice,
    PlanError,
    PlanOptions,
)
from verl_consistency.entrypoints.run.step_metrics import StepLog
from verl_consistency.patches.hooks.ray_setup import placement

EXIT_REFUSED = 2

console = Console(stderr=True)


KIND_LINES = {
    RunKind.RIDE_ALONG: "# collection: ride-along (the default): your training step untouched (full "
    "responses, your reward, the weights move); each request's prompt rows are cut from the "
    "training forward, and pairs of different weight versions are named weights_differ",
    RunKind.PROMPTS_ONLY: "# collection: prompts-only (--prompts-only, the recipe): PROMPTS_ONLY=1 trims "
    "every response to its prompt (the weights do not move); staleness pinned by its overrides",
    RunKind.TOKEN_LEVEL: "# token-level (--token-level): normal responses, no msprobe dump, one token "
    "record per response",
}


def format_dry_run(plan: RunPlan) -> str:
    """The exact environment and command, shell-quoted, one item per line."""
    token_level = plan.kind is RunKind.TOKEN_LEVEL
    phase = [] if token_level else [f"# dump phase: {plan.phase.value}"]
    if plan.phase_reason and phase:
        phase = [f"{phase[0]}: {plan.phase_reason}"]
    lines = [
        f"# verl-consistency run {plan.mode.value} --dry-run: nothing was written or started.",
        f"# pin set: {plan.pin_set} (verl {pins.get('upstream.verl', set_name=plan.pin_set)}); "
        f"verl module: {plan.module}"
        + (
            f"; trainer.v1.trainer_mode={plan.trainer_mode}" if plan.trainer_mode else " (no V1 trainer mode)"
        ),
        KIND_LINES[plan.kind],
        *phase,
        f"# run folder: {plan.run_dir}" + (" (--token-level: no msprobe dump)" if token_level else ""),
        *([] if token_level else [f"# capture: {capture_mod.parse(plan.capture).describe()}"]),
        f"#   msprobe configs: {plan.paths['rollout_config']}, {plan.paths['actor_config']}",
        f"#   prompt set: {plan.paths['train_data']}, reward: {plan.paths['reward_fn']}",
        f"#   token records: {TOKEN_LOG}, {STEP_LOG}"
        if token_level
        else f"#   dumps: {plan.paths['rollout_dir']}/<pid>/, {plan.paths['actor_dir']}/<pid>/",
        f"# then: verl-consistency postprocess {plan.run_dir}",
        "env \\",
    ]
    lines += [f"  {shlex.quote(f'{k}={v}')} \\" for k, v in plan.env.items()]
    argv = plan.argv
    lines.append(f"  {shlex.join(argv[:3])} \\")
    rest = argv[3:]
    cont = " \\"
    lines += [f"  {shlex.quote(a)}{cont if i < len(rest) - 1 else ''}" for i, a in enumerate(rest)]
    return "\n".join(lines)


def prepare_run_dir(plan: RunPlan) -> RunManifest:
    """Write configs, prompt set, reward and run.json. Refuses a run folder that already has a run."""
    lay = plan.layout
    if lay.run_manifest.exists():
        raise PlanError(
            [
                f"{lay.run_manifest} exists: run id {plan.run_id!r} was used already; "
                "pass a new --run-id (or leave it out to get a fresh one)"
            ]
        )
    mscfg.write(lay, plan.msprobe)
    if plan.capture_source is not None:
        from verl_consistency.contracts.atomic import atomic_path

        with atomic_path(lay.run_dir / layout.CAPTURE_PROMPTS) as tmp:
            shutil.copyfile(plan.capture_source, tmp)
    dataset.write_parquet(lay.train_data)
    dataset.write_reward_fn(lay.reward_fn)
    lay.rollout_dir.mkdir(parents=True, exist_ok=True)
    lay.actor_dir.mkdir(parents=True, exist_ok=True)
    manifest = RunManifest(
        run_id=plan.run_id,
        mode=plan.mode.value,
        pin_set=plan.pin_set,
        trainer_mode=plan.trainer_mode,
        device=plan.device.value,
        verl_module=plan.module,
        invocation=plan.invocation,
        command=plan.argv,
        overrides=plan.overrides,
        user_overrides=plan.user_overrides,
        env=plan.env,
        dump_phase=plan.phase.value,
        phase_reason=plan.phase_reason,
        capture=plan.capture,
        kind=plan.kind.manifest_kind,
        collection=plan.kind.collection,
        msprobe=MsprobeConfigs(rollout=plan.msprobe.rollout.to_json(), actor=plan.msprobe.actor.to_json()),
        paths=plan.paths,
    )
    manifest.write(lay.run_manifest)
    return manifest


def count_dump_steps(side_dir: Path) -> int:
    """msprobe step folders written so far under ``<side>/<pid>/step*``."""
    try:
        return sum(1 for p in side_dir.glob("*/step*") if p.is_dir())
    except OSError:
        return 0


def execute(plan: RunPlan, manifest: RunManifest) -> int:
    """Run verl, pass its output on, show progress, forward SIGINT/SIGTERM; return its exit code.

    verl's stdout (where its console logger prints ``step:N - key:value ...``) is read line by
    line for the status line and the per-step metrics (:mod:`.step_metrics`, into ``run.json``'s
    ``steps``), and written to our stdout unchanged; its stderr is not touched.
    """
    lay = plan.layout
    started = time.monotonic()
    proc = subprocess.Popen(
        plan.argv,
        env=plan.child_env(os.environ),
        stdout=subprocess.PIPE,  # read for progress, then passed on; verl's stderr goes straight through
        text=True,
        bufsize=1,
        errors="replace",
    )

    def forward(signum: int, _frame: FrameType | None) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    state = {"step": "-"}
    steps = StepLog()
    done = threading.Event()

    def status_text() -> str:
        elapsed = int(time.monotonic() - started)
        return (
            f"verl {plan.mode.value} · run {plan.run_id} · training step {state['step']} · "
            f"dump steps rollout {count_dump_steps(lay.rollout_dir)} / actor "
            f"{count_dump_steps(lay.actor_dir)} · {elapsed // 60}m{elapsed % 60:02d}s"
        )

    try:
        with console.status(status_text()) as status:

            def refresh() -> None:
                while not done.wait(2.0):
                    status.update(status_text())

            ticker = threading.Thread(target=refresh, daemon=True)
            ticker.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                if steps.feed(line):
                    state["step"] = str(steps.last_step)
                sys.stdout.write(line)
                sys.stdout.flush()
            code = proc.wait()
            done.set()
    finally:
        done.set()
        for s, handler in previous.items():
            signal.signal(s, handler)

    final = manifest.model_copy(
        update={"finished_at": now_utc(), "exit_code": code, "steps": steps.records()}
    )
    final.write(lay.run_manifest)
    elapsed = int(time.monotonic() - started)
    counts = (
        f"rollout dump steps {count_dump_steps(lay.rollout_dir)}, "
        f"actor dump steps {count_dump_steps(lay.actor_dir)}"
    )
    if code == 0:
        console.print(
            f"[green]✔ run {plan.run_id} finished in {elapsed // 60}m{elapsed % 60:02d}s: dumps in "
            f"{lay.run_dir} ({counts}). Next: verl-consistency postprocess {lay.run_dir}[/green]",
            highlight=False,
        )
    else:
        console.print(
            f"[red]✘ verl exited with code {code} after {elapsed // 60}m{elapsed % 60:02d}s; "
            f"partial dumps in {lay.run_dir} ({counts}); its run.json records the failure. "
            f"Fix the error above and start a new run (new --run-id).[/red]",
            highlight=False,
        )
    return code


# The command's argument and options, one alias each (typer reads them from the annotations).
_ModeArg = Annotated[
    Mode,
    typer.Argument(
        help="current pin set (verl 0.8.0): hybrid = verl.trainer.main_ppo; fully-async = "
        "verl.experimental.fully_async_policy.fully_async_main. next pin set (verl 0.9.1, "
        "VERL_CONSISTENCY_PIN_SET=next): verl.trainer.main_ppo with trainer.v1.trainer_mode "
        "sync (hybrid), separate_async (fully-async) or colocate_async (colocate-async)."
    ),
]
_DumpRootOpt = Annotated[
    Path,
    typer.Option(envvar=env.DUMP_ROOT, help="The shared dump volume; the run writes <dump-root>/<run-id>/."),
]
_RunIdOpt = Annotated[
    str | None,
    typer.Option(envvar=env.RUN_ID, help="Run folder name (default: <mode>-<UTC time>-<4 hex>)."),
]
_TaskOpt = Annotated[
    mscfg.Task | None,
    typer.Option(
        help="msprobe task (default: statistics; tensor when --capture is a sample, a fraction "
        "below 1 or prompts:FILE, see bench/README-selective.md)."
    ),
]
_LevelOpt = Annotated[mscfg.Level, typer.Option(help="msprobe level: L0 modules, L1 APIs, mix both.")]
_StepsOpt = Annotated[
    str | None,
    typer.Option(help="msprobe steps to dump on each side, e.g. 0-9 or 0,2,5-7 (default: all)."),
]
_RanksOpt = Annotated[str | None, typer.Option(help="Ranks to dump, same syntax (default: all).")]
_ModulesOpt = Annotated[
    str | None,
    typer.Option(
        help="msprobe list, the same on both sides: comma-separated module/API names, or all "
        "(default: Attention.forward,MLP.forward for tensor at L0; all otherwise)."
    ),
]
_DataModeOpt = Annotated[
    str | None,
    typer.Option(
        help="msprobe data_mode, the same on both sides: all, or a comma list of "
        "input,output,forward,backward (default: forward,output for tensor; all for statistics)."
    ),
]
_PhaseOpt = Annotated[
    PhaseChoice,
    typer.Option(
        envvar=DUMP_PHASE,
        help="Training phase to dump (DUMP_PHASE). log_prob: the forward-only pass that recomputes "
        "old log-probs, with the weights the rollout had. update_actor: the actor update's forward "
        "and backward (the optimizer still steps). all: both. auto (the default): log_prob, or "
        "update_actor in a ride-along run with bypass mode in force "
        "(algorithm.rollout_correction.bypass_mode, verl 0.8.0 fully-async's default), which "
        "skips the old-log-prob pass; --phase log_prob is refused then.",
    ),
]
_CaptureOpt = Annotated[
    str,
    typer.Option(
        envvar=env.CAPTURE,
        help="Requests to dump. fraction:1 (the default): every request; each prefill step and "
        "micro batch is dumped one lane per comparable request, decodes never, so nearly every "
        "request pairs. fraction:F (0<F<1, by a hash of the request id) or prompts:FILE (the "
        "prompts FILE lists, e.g. a report's capture-these.txt): a sample, in tensor mode. all: "
        "the recipe, every step whole, decodes included; pairs only single-request prefill steps.",
    ),
]
_ModelOpt = Annotated[
    str | None,
    typer.Option(
        help=f"Model path (= model=PATH = actor_rollout_ref.model.path); "
        f"default ${env.MODEL} or {DEFAULT_MODEL}."
    ),
]
_TokenLevelOpt = Annotated[
    bool,
    typer.Option(
        "--token-level",
        help="A cheap triage run: normal responses (no PROMPTS_ONLY trim), no msprobe dump, one "
        "token_mismatch.jsonl record per response (vLLM's against the trainer's log-probs).",
    ),
]
_PromptsOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--prompts-only/--ride-along",
        help="--ride-along (the default): collect inside your own training step (full responses, "
        "your reward, the weights move); the training forward is cut to each request's prompt rows, "
        "and records carry weight versions, so staleness is named (weights_differ), not prevented. "
        "--prompts-only: the recipe: PROMPTS_ONLY=1 trims every response to its prompt, and the "
        "run pins staleness (rollout_correction=null, staleness_threshold=0, ...); bypass mode refused.",
    ),
]
_DeviceOpt = Annotated[
    Device,
    typer.Option(
        help="Accelerator: npu (Ascend; verl detects it) or cuda (NVIDIA; sets trainer.device=cuda). "
        "The dump hooks, layout and postprocess are the same."
    ),
]
_DryRunOpt = Annotated[
    bool,
    typer.Option("--dry-run", help="Print the exact environment and command; write and start nothing."),
]
_AsJsonOpt = Annotated[bool, typer.Option("--json", help="With --dry-run: print it as JSON.")]
_ShowTableOpt = Annotated[
    bool, typer.Option("--table", help="Print the whole override table as JSON and exit.")
]


def run_command(
    ctx: typer.Context,
    mode: _ModeArg,
    dump_root: _DumpRootOpt = layout.DEFAULT_DUMP_ROOT,
    run_id: _RunIdOpt = None,
    task: _TaskOpt = None,
    level: _LevelOpt = mscfg.Level.L0,
    steps: _StepsOpt = None,
    ranks: _RanksOpt = None,
    modules: _ModulesOpt = None,
    data_mode: _DataModeOpt = None,
    phase: _PhaseOpt = PhaseChoice.AUTO,
    capture: _CaptureOpt = capture_mod.RUN_DEFAULT,
    model: _ModelOpt = None,
    token_level: _TokenLevelOpt = False,
    prompts_only: _PromptsOnlyOpt = False,
    device: _DeviceOpt = Device.NPU,
    dry_run: _DryRunOpt = False,
    as_json: _AsJsonOpt = False,
    show_table: _ShowTableOpt = False,
) -> None:
    """Launch a verl collection run with both msprobe dumps on. Extra arguments are verl (Hydra)
    overrides, passed through unchanged unless they would spoil the data (then: exit code 2).
    `--cfg job` / `--resolve` after the overrides are passed to verl too (print the config only)."""
    if show_table:
        typer.echo(Table().model_dump_json(indent=2))
        raise typer.Exit(0)
    rid = run_id or layout.new_run_id(mode.value)
    try:
        options = options_from(
            PlanOptions, locals(), run_id=rid, extra_args=ctx.args, phase=phase.dump_phase()
        )
        plan = build_plan(mode, options)
    except PlanError as exc:
        for message in exc.messages:
            console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        console.print(f"nothing was written or started ({len(exc.messages)} problem(s)).", highlight=False)
        raise typer.Exit(EXIT_REFUSED) from None

    mismatch = installed_verl_mismatch()
    if dry_run:
        if mismatch:
            console.print(f"[yellow]warning:[/yellow] {escape(mismatch)}", highlight=False, soft_wrap=True)
        typer.echo(json.dumps(plan.as_json(), indent=2) if as_json else format_dry_run(plan))
        raise typer.Exit(0)
    if mismatch:
        console.print(f"[red]error:[/red] {escape(mismatch)}", highlight=False, soft_wrap=True)
        console.print("nothing was written or started.", highlight=False)
        raise typer.Exit(EXIT_REFUSED)

    try:
        with console.status(f"writing run folder {plan.run_dir}"):
            manifest = prepare_run_dir(plan)
    except PlanError as exc:
        for message in exc.messages:
            console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_REFUSED) from None
    console.print(
        f"run {plan.run_id}: wrote msprobe configs, prompt set and run.json to {plan.run_dir}; "
        f"starting {plan.module}",
        highlight=False,
    )
    raise typer.Exit(execute(plan, manifest))


def installed_verl_mismatch() -> str | None:
    """Why this environment cannot run the pin set in force, or None.

    The plan is composed for one pin set's verl (its modes, keys and refusals differ), so a
    next-set plan on a current-set image would fail deep inside Hydra or, worse, run with
    patches that were never applied. Read from the package metadata: importing verl would pull
    in torch_npu. No verl at all is not a mismatch here (a dry run on a laptop).
    """
    p = pins.load()
    have = placement.installed_verl_version()
    if have is None or have.split("+", 1)[0] == p.upstream.verl:
        return None
    return (
        f"pin set {p.set.name!r} is for verl {p.upstream.verl}, but verl {have} is installed here. "
        f"Run the image built for this set (make image PINS={p.set.name}), or set "
        f"{env.PIN_SET} to the set whose verl is installed "
        f"(python3 patches/contracts/pins.py --sets lists them)."
    )


RUN_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def register(app: typer.Typer) -> None:
    app.command("run", context_settings=RUN_CONTEXT)(run_command)
