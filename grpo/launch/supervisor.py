"""Starting, watching and stopping processes: one supervisor for a single run and for seeded instances.

A single run (`run`): the learner ranks and the samplers start together; one watch loop, bounded
until learner rank 0 has bound its ports (the `learner.ready` file), then printing each new step's
status line; it restarts a dead sampler when --restart-samplers allows, and ends the run when any
process fails or the learner finishes. Seeded instances (`run_instances`): one child launcher per
instance (grpo.launch.plan.plan_instances says which GPUs, ports and run directory); a failed
instance is reported with the tail of its log and the others carry on.

Every child runs in its own session (a terminal Ctrl+C reaches only us, and we stop children
in order) and dies with the launcher (PR_SET_PDEATHSIG), so no run leaves orphans.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path

from grpo.config import LaunchConfig
from grpo.launch.ending import end_lines, read_summary
from grpo.launch.plan import Instance, ProcSpec, parse_gpus
from grpo.obs import stages
from grpo.rules.layout import advice, measured


class Supervisor:
    """Owns the child processes: start, watch, report, stop (no orphans)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.procs: dict[str, tuple[subprocess.Popen, ProcSpec, Path]] = {}
        self.started: dict[str, float] = {}   # wall-clock start of each process's newest incarnation
        self.stopping = 0   # the first signal that asked us to stop, once one has
        self.signals = 0    # how many have come: a second one stops everything at once
        self._noted: dict[str, float] = {}

    def catch_signals(self) -> None:
        """Ctrl+C / SIGTERM set `stopping` (the first one's number) and count; the watch loop then
        stops the children (run: the learner saves first, unless a second signal comes)."""
        def on_signal(signum, _frame):
            self.signals += 1
            self.stopping = self.stopping or signum

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def start(self, spec: ProcSpec, log_path: Path | None = None) -> None:
        log_path = log_path or self.run_dir / f"{spec.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as fh:
            # In the launcher's folder: a relative path the user gave (--reward ./mine.py:fn, --dataset
            # ./data) means there what it meant where the launcher checked it; the entry scripts are
            # absolute, and the default deepspeed.json is found beside them (load_ds_config).
            p = subprocess.Popen(spec.argv, env=spec.env, stdout=fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, cwd=os.getcwd(),
                                 preexec_fn=_die_with_parent)
        self.procs[spec.name] = (p, spec, log_path)
        self.started[spec.name] = time.time()
        self._noted.pop(spec.name, None)
        # Which pid is which process, for whoever operates the run (and the no-orphan test); written
        # aside and renamed in, so a reader never sees it half written (a test polling it read '').
        pids = {n: q.pid for n, (q, _, _) in self.procs.items()}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / ".pids.json.tmp"
        tmp.write_text(json.dumps({"launcher": os.getpid(), **pids}) + "\n")
        os.replace(tmp, self.run_dir / "pids.json")

    def note_late(self, bound_s: float) -> None:
        """Name every process that has not reached its next startup stage within bound_s (grpo.obs.stages)."""
        if bound_s <= 0:
            return
        live = {n: t for n, t in self.started.items() if self.procs[n][0].poll() is None}
        for name, last, nxt, doing, waited in stages.overdue(live, stages.read(self.run_dir), time.time(), bound_s,
                                                             self._noted):
            print(f"[launcher] {name} has not reached '{nxt}' after {waited:.0f} s (last stage: {last}); it is "
                  f"{doing}. Last lines of {name}.log:\n{self.tail(name, 5)}", file=sys.stderr, flush=True)

    def failed(self) -> tuple[str, int] | None:
        for name, (p, _, _) in self.procs.items():
            rc = p.poll()
            if rc not in (None, 0):
                return name, rc
        return None

    def user_error(self, name: str) -> str | None:
        """The one-line user mistake a worker reported before it exited 2 ('<prog>: error: ...'), or None."""
        text = self.procs[name][2].read_text(errors="replace").splitlines()
        return next((line.split(": error: ", 1)[1] for line in reversed(text) if ": error: " in line), None)

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.procs[name][2]
        text = path.read_text(errors="replace").splitlines()
        return "\n".join("    " + line for line in text[-lines:])

    def wait_all(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for n in names:
            p = self.procs[n][0]
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def send(self, names: list[str], sig: int) -> None:
        """`sig` to each named process itself, not its group: the learner's own helpers (compile
        workers) must not die under it while it saves."""
        for n in names:
            p = self.procs[n][0]
            if p.poll() is None:
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass

    def kill(self, names: list[str]) -> None:
        """SIGKILL to each named process's group, now: whatever it was doing (a second Ctrl+C)."""
        for n in names:
            p = self.procs[n][0]
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
                p.wait()

    def stop(self, timeout: float) -> None:
        live = [(n, p) for n, (p, _, _) in self.procs.items() if p.poll() is None]
        for _, p in live:
            _signal_group(p, signal.SIGTERM)   # the whole group: helpers a worker spawned stop too
        deadline = time.monotonic() + timeout
        for n, p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"[launcher] {n} did not stop in {timeout:.0f} s; killing it", flush=True)
                _signal_group(p, signal.SIGKILL)
                p.wait()


def _die_with_parent() -> None:
    """In the child: the kernel kills it if the launcher dies (even by SIGKILL): no orphans."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the launcher's own stop() is the only guard


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"failed with exit code {rc}"


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def _num(value, places: int) -> str:
    """A step record's figure for the status line: metrics.jsonl writes NaN and infinities as null."""
    return "nan" if value is None else f"{value:.{places}f}"


def _status_line(run_dir: Path, seen: int) -> tuple[int, str | None]:
    """The launcher's line for the newest step record that metrics.jsonl gained since byte `seen`,
    and the bytes read so far. Only whole lines count: the learner appends a record while this
    reads, and a read that races that write can return its first part only, so the part after
    the last newline is left for the next poll. A whole line that does not parse, or lacks a
    step's figures, is passed over: the status line is only news, and must never end the run it
    reports on."""
    try:
        with open(run_dir / "metrics.jsonl", "rb") as fh:
            fh.seek(seen)
            chunk = fh.read()
    except FileNotFoundError:
        return seen, None
    end = chunk.rfind(b"\n") + 1
    for raw in reversed(chunk[:end].splitlines()):
        try:
            rec = json.loads(raw)
            if rec.get("final"):
                return seen + end, None
            return seen + end, (f"[launcher] step {rec['step']} loss {_num(rec['loss'], 4)} reward "
                                f"{_num(rec['reward_mean'], 3)} acc {_num(rec['accuracy'], 3)} "
                                f"{_num(rec['samples_per_s'], 1)} samples/s samplers at {rec['sampler_versions']} "
                                f"groups {rec['groups']}")
        except (ValueError, KeyError, AttributeError):
            continue
    return seen + end, None


def _restarted(sup: Supervisor, bad: tuple[str, int] | None, restarts: dict[str, int], allowed: int) -> bool:
    """--restart-samplers: start a dead sampler again while it has restarts left (said with its log's tail)."""
    if not (bad and bad[0] in restarts and restarts[bad[0]] < allowed):
        return False
    restarts[bad[0]] += 1
    print(f"[launcher] {bad[0]} {describe_exit(bad[1])}; restarting it ({restarts[bad[0]]} of {allowed}). "
          f"Last lines of {bad[0]}.log:\n{sup.tail(bad[0])}", file=sys.stderr, flush=True)
    sup.start(sup.procs[bad[0]][1])
    return True


# How long a process failing at start-up waits for the launch check to finish: the check names the
# problem in one line where the process's log tail would name it in fifteen.
CHECK_WAIT_S = 30.0


def _check_failed(check: Future | None, wait_s: float = 0.0) -> bool:
    """Say the launch check's problem, if it has finished with one (waiting up to `wait_s` for it),
    as the launcher's one-line error. A check that raised counts as passed: the samplers repeat
    it themselves and name the problem in their logs."""
    if check is None:
        return False
    futures.wait([check], timeout=wait_s)
    problem = check.result() if check.done() and check.exception() is None else None
    if problem:
        print(f"run_distributed.py: error: {problem}", file=sys.stderr, flush=True)
    return bool(problem)


def gpus_per_sampler(run_dir: Path) -> int:
    """--vllm-tensor-parallel-size of the run's samplers, from sampler 0's saved config (1 without one)."""
    try:
        return int(json.loads((run_dir / "config_sampler0.json").read_text()).get("vllm_tensor_parallel_size", 1))
    except (OSError, ValueError, TypeError, AttributeError):
        return 1


def layout_note(cfg: LaunchConfig, run_dir: Path, summary: dict) -> str | None:
    """grpo.rules.layout's advice on the run's measured rates, where the user gave samplers and
    learner ranks GPUs of their own; None otherwise, or when the rates give no reason, or when a
    sampler spread over several GPUs (the advice's splits count one GPU a sampler)."""
    if gpus_per_sampler(run_dir) > 1:
        return None
    try:
        sampling, training = parse_gpus(cfg.placement.sampling_gpus,
                                        "--sampling-gpus"), parse_gpus(cfg.placement.training_gpus,
                                                                                          "--training-gpus")
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return None
    rates = measured(metrics, summary)
    return advice(rates, sampling, training) if rates else None


def _refused(sup: Supervisor, bad: tuple[str, int]) -> bool:
    """Whether the failed worker refused its start (exit 2 with its one-line user mistake), which
    then is the launcher's own line: the launch is refused (exit 2), not a run that failed."""
    if bad[1] != 2 or not (mistake := sup.user_error(bad[0])):
        return False
    print(f"run_distributed.py: error: {mistake}", file=sys.stderr, flush=True)
    return True


# While the learner saves after a stop, a word this often: what the launcher waits for, and how to
# stop waiting.
STOP_NOTE_S = 15.0


def _end_lines(cfg: LaunchConfig, run_dir: Path, t_launch: float, signal_name: str = "", resume: str = "") -> None:
    """Print the notes the run's summary carries, then its last lines (grpo.launch.ending): what it
    made comes last, where a reader looks, and a stopped run's resume command is the very last."""
    summary = read_summary(run_dir)
    if summary is not None:
        failed = summary.get("reward_failures") or {}
        failed_line = (f"reward failures: {sum(failed.values())} completions scored their reward's "
                       f"failure value ({', '.join(f'{k} {n}' for k, n in failed.items())})" if failed else None)
        for line in (layout_note(cfg, run_dir, summary), summary.get("staleness_note"), failed_line):
            if line:
                print(f"[launcher] {line}", flush=True)
    for line in end_lines(run_dir, summary, time.monotonic() - t_launch, signal_name, resume):
        print(f"[launcher] {line}", flush=True)


def _stop_keeping_work(sup: Supervisor, cfg: LaunchConfig, learners: list[str], samplers: list[str], seen: int,
                       t_launch: float, resume: str) -> int:
    """After the learner is ready, the first Ctrl+C or SIGTERM: pass it on to the learner ranks, which
    finish the step in hand, save it, tell the samplers to stop and write summary.json
    (grpo.learner.stop); wait for them up to --stop-save-timeout-s, with a word every STOP_NOTE_S;
    then say what was saved and how to resume. A second signal, or the bound, stops every process
    at once without the save. Returns the launcher's exit code: 128 + the first signal's number."""
    signum = sup.stopping
    name = signal.Signals(signum).name
    run_dir = sup.run_dir
    print(f"[launcher] {name}: the learner finishes the step in hand, saves it and writes summary.json, and the "
          f"samplers stop with it (up to {cfg.supervision.stop_save_timeout_s:.0f} s, --stop-save-timeout-s); press Ctrl+C "
          f"again to stop every process at once, without saving", flush=True)
    sup.send(learners, signum)
    t0 = time.monotonic()
    next_note = t0 + STOP_NOTE_S
    while any(sup.procs[n][0].poll() is None for n in learners):
        now = time.monotonic()
        if sup.signals > 1:
            print(f"[launcher] {name} again: stopping every process now, without saving", flush=True)
            sup.kill(learners)   # it may be inside a long native call, where it would not hear a signal
            return 128 + signum
        if now - t0 > cfg.supervision.stop_save_timeout_s:
            print(f"[launcher] the learner has not finished saving within {cfg.supervision.stop_save_timeout_s:.0f} s "
                  f"(--stop-save-timeout-s); stopping every process without its save. Last lines of "
                  f"learner0.log:\n{sup.tail('learner0', 5)}", file=sys.stderr, flush=True)
            return 128 + signum
        if now >= next_note:
            last = (sup.tail("learner0", 1).strip() or "(empty)")
            print(f"[launcher] still waiting for the learner to save and write its summary ({now - t0:.0f} s of up "
                  f"to {cfg.supervision.stop_save_timeout_s:.0f} s; Ctrl+C again stops at once without saving); learner0.log "
                  f"says: {last}", flush=True)
            next_note = now + STOP_NOTE_S
        seen, line = _status_line(run_dir, seen)   # the step in hand, finished
        if line:
            print(line, flush=True)
        time.sleep(0.2)
    # The learner told the samplers to stop before it saved; they leave on their own (the finally
    # of run() stops what is left).
    sup.wait_all(samplers, cfg.supervision.stop_timeout_s)
    rc = sup.procs["learner0"][0].returncode
    if rc not in (0, -signum):
        print(f"[launcher] learner0 {describe_exit(rc)} while stopping. Last lines of learner0.log:\n"
              f"{sup.tail('learner0')}", file=sys.stderr, flush=True)
    elif rc == -signum:
        # the signal's default action: the learner was still starting, with no step trained
        print("[launcher] the learner was still starting (no step trained in this launch) and stopped at once",
              flush=True)
    _end_lines(cfg, run_dir, t_launch, name, resume)
    return 128 + signum


def _unbound_end(sup: Supervisor, bad: tuple[str, int] | None, cfg: LaunchConfig, run_dir: Path) -> int:
    """The end of a run whose learner has not bound its ports, said in its line, and the exit code: a
    worker's refusal (2), a signal (128 + it), a failed process or the start-up's bound passed (1)."""
    if bad and _refused(sup, bad):
        return 2
    if bad:
        print(f"[launcher] {bad[0]} exited with code {bad[1]} before the learner bound its ports:\n"
              f"{sup.tail(bad[0])}", file=sys.stderr, flush=True)
    elif sup.stopping:
        print(f"[launcher] {signal.Signals(sup.stopping).name} before the learner bound its ports: "
              f"stopping every process (nothing trained, nothing to save)", flush=True)
        return 128 + sup.stopping
    else:
        print(f"[launcher] the learner did not bind its ports within {cfg.supervision.ready_timeout_s:.0f} s; "
              f"see {run_dir}/learner0.log", file=sys.stderr, flush=True)
    return 1


def _start_all(sup: Supervisor, learners: list[ProcSpec], samplers: list[ProcSpec], run_dir: Path) -> None:
    """Every process starts now: a sampler's imports, prompts and model load (about 20 s on a GPU
    machine) overlap the learner's, and ZeroMQ connects whenever the learner binds. The ports were
    checked free before this, so a learner that cannot bind is rare; if it fails, the watch loop
    stops the samplers with it."""
    print(f"[launcher] run dir {run_dir}; {len(learners)} learner rank(s), {len(samplers)} sampler(s); "
          f"logs: {', '.join(s.name + '.log' for s in learners + samplers)}", flush=True)
    for s in learners + samplers:
        sup.start(s)


def _learner_finished(sup: Supervisor, cfg: LaunchConfig, names: list[str], run_dir: Path, t_launch: float) -> int:
    """Learner rank 0 exited 0, having told the samplers to stop: everyone gets time to exit on their
    own, then the run's end lines; the exit code of the run."""
    ok = sup.wait_all(names, cfg.supervision.stop_timeout_s)
    if (run_dir / "summary.json").exists():
        _end_lines(cfg, run_dir, t_launch)
    bad = sup.failed()
    if bad:
        print(f"[launcher] {bad[0]} exited with code {bad[1]}:\n{sup.tail(bad[0])}", file=sys.stderr, flush=True)
        return 1
    if not ok:
        # The run's work is done (the learner wrote its summary and exited 0): the stragglers are
        # stopped by run's finally, and the run still succeeded.
        late = [n for n, (p, _, _) in sup.procs.items() if p.poll() is None]
        print(f"[launcher] {', '.join(late)} did not exit within {cfg.supervision.stop_timeout_s:.0f} s of the "
              f"learner finishing; stopping them (the run itself completed)", flush=True)
    return 0


def run(cfg: LaunchConfig, specs: list[ProcSpec], run_dir: Path, check: Future | None = None,
        resume: str = "", warnings: tuple[str, ...] = ()) -> int:
    """One run: start the learner group, then the samplers, and watch them to the end. `check`: a
    launch check still running as they start (its result: None, or a one-line problem); if it
    finds a problem, the run stops with its line and exit code 2. `resume`: the command that
    resumes this run from its newest checkpoint, said when a signal stops it. `warnings`: lines said
    on stderr once the run is sure to start (the learner bound its ports and the launch check
    passed), so that a refused launch says its mistake alone."""
    t_launch = time.monotonic()
    sup = Supervisor(run_dir)
    learners = [s for s in specs if s.role == "learner"]
    samplers = [s for s in specs if s.role == "sampler"]
    sup.catch_signals()
    try:
        _start_all(sup, learners, samplers, run_dir)
        ready = run_dir / "learner.ready"
        deadline = time.monotonic() + cfg.supervision.ready_timeout_s
        restarts = {s.name: 0 for s in samplers}
        bound = False   # learner rank 0 has bound its ports (its ready file exists)
        seen = 0
        # One watch loop from the start to the end, so that both phases poll alike: every poll asks the
        # launch check, looks for a failed process (said by the check's line when it has one) and
        # restarts a dead sampler while it has restarts left. Before the learner binds its ports, the
        # start-up's bound applies and any end is a failed start (_unbound_end); after, the status
        # lines, the stop that keeps the learner's work, and the run's own end.
        while True:
            if not bound and ready.exists():
                bound = True
                print(f"[launcher] learner ready on {cfg.run.host}:{cfg.run.data_port}/{cfg.run.sync_port}", flush=True)
            if _check_failed(check):
                return 2
            if not bound:
                sup.note_late(cfg.supervision.stage_timeout_s)
            else:
                if warnings and (check is None or check.done()):
                    for w in warnings:
                        print(f"run_distributed.py: warning: {w}", file=sys.stderr, flush=True)
                    warnings = ()
                if sup.stopping:
                    return _stop_keeping_work(sup, cfg, [s.name for s in learners], [s.name for s in samplers], seen,
                                              t_launch, resume)
            bad = sup.failed()
            if bad and _check_failed(check, CHECK_WAIT_S):
                return 2
            if _restarted(sup, bad, restarts, cfg.supervision.restart_samplers):
                continue
            if not bound:
                if bad or sup.stopping or time.monotonic() > deadline:
                    return _unbound_end(sup, bad, cfg, run_dir)
                time.sleep(0.2)
                continue
            # after the learner bound its ports but before any step (a sampler's model loads after
            # that), a worker's refusal is still a refused launch
            if bad and stages.first_step_s(stages.history(run_dir)) is None and _refused(sup, bad):
                return 2
            if bad:
                print(f"[launcher] {bad[0]} {describe_exit(bad[1])}; stopping the run. "
                      f"Last lines of {bad[0]}.log:\n{sup.tail(bad[0])}", file=sys.stderr, flush=True)
                return 1
            seen, line = _status_line(run_dir, seen)
            if line:
                print(line, flush=True)
            sup.note_late(cfg.supervision.stage_timeout_s)
            if sup.procs["learner0"][0].poll() == 0:
                return _learner_finished(sup, cfg, [s.name for s in specs], run_dir, t_launch)
            time.sleep(0.5)
    finally:
        sup.stop(cfg.supervision.stop_timeout_s)
        # Learner rank 0 removes its ready file as it exits; one it could not (killed, or stopped
        # before it could) would tell a reader of the folder that ports are bound that are not.
        if sup.procs.get("learner0") and sup.procs["learner0"][0].poll() is not None:
            (run_dir / "learner.ready").unlink(missing_ok=True)


def run_instances(cfg: LaunchConfig, instances: list[Instance], argvs: list[list[str]], base_dir: Path) -> int:
    """Seeded instances: one child launcher each (argvs[k] for instances[k]), its log in its run dir."""
    sup = Supervisor(base_dir)
    sup.catch_signals()
    names = {}
    try:
        for inst, argv in zip(instances, argvs):
            name = f"instance{inst.index}"
            names[name] = inst
            log_path = inst.run_dir / "launcher.log"
            sup.start(ProcSpec(name, argv, dict(os.environ, PYTHONUNBUFFERED="1"), "instance"), log_path)
            gpus = (f"; sampling GPUs {inst.sampling_gpus}, training GPUs {inst.training_gpus}"
                    if inst.sampling_gpus else "")
            print(f"[instances] {inst.index}: seed {inst.seed}, ports {inst.data_port}/{inst.sync_port}{gpus}; "
                  f"run dir {inst.run_dir}, log {log_path}", flush=True)
        done: dict[str, int] = {}
        while len(done) < len(names) and not sup.stopping:
            for name, (p, _, log_path) in sup.procs.items():
                rc = p.poll()
                if rc is not None and name not in done:
                    done[name] = rc
                    inst = names[name]
                    print(f"[instances] {inst.index} (seed {inst.seed}) "
                          + ("finished" if rc == 0 else f"{describe_exit(rc)}; last lines of {log_path}:\n"
                                                        f"{sup.tail(name)}"), flush=True)
            time.sleep(0.5)
        if sup.stopping:
            print(f"[instances] {signal.Signals(sup.stopping).name}: stopping every instance", flush=True)
            return 128 + sup.stopping
        return 0 if all(rc == 0 for rc in done.values()) else 1
    finally:
        # Each child launcher stops its own processes (its workers die with it if it is killed), its
        # learner saving first: it is given that time too.
        sup.stop(cfg.supervision.stop_save_timeout_s + cfg.supervision.stop_timeout_s + 15)
