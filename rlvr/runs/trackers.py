"""Experiment trackers beside metrics.jsonl: `run.report_to` (TRL's report_to, verl's trainer.logger).

    run.report_to=tensorboard            today's default: RUN/tb/ (written by RunDir itself)
    run.report_to=wandb,mlflow           a comma list; `none` = metrics.jsonl only

Each backend is an optional extra (`pip install 'rlvr[wandb]'`, `[trackio]`, `[mlflow]`), imported
only when a run opens it, and works offline by default, with its files in the run directory:

    wandb    offline mode unless WANDB_MODE is set; RUN/wandb/offline-run-*/ (`wandb sync` uploads it)
    trackio  its local SQLite store in RUN/trackio/ unless TRACKIO_DIR is set (`trackio show`)
    mlflow   a SQLite store sqlite:///RUN/mlflow.db unless MLFLOW_TRACKING_URI is set (`mlflow ui
             --backend-store-uri sqlite:///RUN/mlflow.db`); MLflow 3 refuses the old file store
             (./mlruns) unless MLFLOW_ALLOW_FILE_STORE=true, so the run does not use it

Every logged row of metrics.jsonl goes to each tracker: every numeric metric under the same name, at
step = the row's step (`numeric_metrics`: not the row's `time`; MLflow refuses some characters in names:
`mlflow_name`). The resolved config is the tracker run's config (wandb, trackio) or params
(mlflow, dotted keys); the tracker run is named after the run directory. A resumed run continues the
same tracker run: wandb by the id kept in RUN/trackers.json (resume="allow"), mlflow by the run id kept
there, trackio by the run's name (resume="allow").

A tracker never loses the run: one that fails to open or to log (an import error after validation, a
backend exception) warns once, naming `run.report_to=<name>`, and is dropped; training goes on and
metrics.jsonl keeps every row. `report_to_problems` is the config check (torch-free and backend-free:
importlib.util.find_spec only).

No credential in a run file or a console line: a tracker location written to RUN/trackers.json or printed
(MLFLOW_TRACKING_URI's `http://user:PASSWORD@host`, `postgresql://user:pass@host/db`) goes through
`redact_uri` (user:***@, and the value of a query parameter named like a token, password, key or secret:
***), and every line this module prints or warns goes through `redact_text` (each URI in it redacted, and
the value of a secret environment variable, SECRET_ENV, or a URI_ENV URI's password replaced by ***).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sys
import time
import urllib.parse
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BACKENDS = ("tensorboard", "wandb", "trackio", "mlflow", "none")
"""The names run.report_to accepts (a comma list of them; `none` alone)."""

EXTERNAL = ("wandb", "trackio", "mlflow")
"""The backends this module opens (TensorBoard is RunDir's own writer)."""

STATE_FILE = "trackers.json"
"""RUN/trackers.json: what a resumed run needs to continue its tracker runs (wandb id, mlflow run id)."""

PROJECT = "rlvr"
"""The wandb project, trackio project and mlflow experiment unless WANDB_PROJECT, TRACKIO_PROJECT or
MLFLOW_EXPERIMENT_NAME says otherwise."""


SECRET_ENV = ("WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "DATABRICKS_TOKEN",
              "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "TRACKIO_WRITE_TOKEN")
"""Environment variables whose values never appear in a line this module prints or warns (`redact_text`)."""

URI_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "WANDB_BASE_URL")
"""Environment variables holding a URI whose password and secret query values never appear either."""

REDACTED = "***"

_SECRET_PARAM = re.compile(r"token|passw|pwd|secret|key|auth|credential|signature|sig$|^sig", re.IGNORECASE)
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")


def redact_uri(uri: str) -> str:
    """`uri` without its credentials: the password of user:password@ becomes *** (a user alone, which may be
    a token as in https://TOKEN@host, becomes ***), and so does the value of each query parameter named like
    a token, password, key or secret (`?token=...&sslmode=require` -> `?token=***&sslmode=require`). A
    string without scheme:// (a path, `databricks`) is returned as it is."""
    if "://" not in uri:
        return uri
    scheme, sep, rest = uri.partition("://")
    end = len(rest)
    for ch in "/?#":
        i = rest.find(ch)
        if i != -1:
            end = min(end, i)
    netloc, tail = rest[:end], rest[end:]
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"  # a lone user may be a token
    if "?" in tail:
        path, _, query = tail.partition("?")
        query, hash_, fragment = query.partition("#")
        items = []
        for item in query.split("&"):
            name, eq, _value = item.partition("=")
            items.append(f"{name}={REDACTED}" if eq and _SECRET_PARAM.search(name) else item)
        tail = f"{path}?{'&'.join(items)}{hash_}{fragment}"
    return f"{scheme}{sep}{netloc}{tail}"


def _secret_values() -> list[str]:
    """The secrets of the environment: each SECRET_ENV value whole, and the password and secret query values
    of each URI_ENV URI; longest first (so a value containing another is replaced whole)."""
    found = {os.environ[name] for name in SECRET_ENV if os.environ.get(name)}
    for name in URI_ENV:
        value = os.environ.get(name, "")
        if "://" not in value:
            continue
        rest = value.partition("://")[2]
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        if "@" in netloc:
            userinfo = netloc.rpartition("@")[0]
            user, colon, password = userinfo.partition(":")
            secret = password if colon else user
            found.add(secret)
            found.add(urllib.parse.unquote(secret))
        query = rest.partition("?")[2].partition("#")[0]
        for name_, _, v in (item.partition("=") for item in query.split("&")):
            if v and _SECRET_PARAM.search(name_):
                found.add(v)
                found.add(urllib.parse.unquote(v))
    return sorted((v for v in found if len(v) >= 4), key=len, reverse=True)  # 4+: no masking of every "a"


def redact_text(text: str) -> str:
    """`text` (a message, an exception's words) with every URI in it redacted (`redact_uri`) and each
    environment secret (`_secret_values`) replaced by ***."""
    text = _URI_IN_TEXT.sub(lambda m: redact_uri(m.group(0)), text)
    for secret in _secret_values():
        text = text.replace(secret, REDACTED)
    return text


def parse_report_to(spec: str | Sequence[str] | None) -> list[str]:
    """The backend names of a run.report_to value, in order, without repeats; ValueError (naming the
    key) on an unknown name or `none` with others. '' and None mean `none`."""
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for raw in items:
        name = str(raw).strip().lower()
        if not name:
            continue
        if name not in BACKENDS:
            raise ValueError(f"run.report_to: {raw.strip()!r} is unknown; known: "
                             f"{', '.join(repr(b) for b in BACKENDS)} (a comma list)")
        if name not in names:
            names.append(name)
    if "none" in names:
        if len(names) > 1:
            raise ValueError(f"run.report_to={','.join(names)!r}: 'none' cannot be combined with a backend")
        return []
    return names


def report_to_problems(spec: str | Sequence[str] | None) -> list[str]:
    """The config errors of a run.report_to value: unknown names, and each chosen external backend that is
    not installed (with the pip command). TensorBoard is not required: without it the run says so and
    writes no events, as before run.report_to existed."""
    try:
        names = parse_report_to(spec)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    for name in names:
        if name in EXTERNAL and importlib.util.find_spec(name) is None:
            problems.append(f"run.report_to={name!r} needs the {name} package: pip install 'rlvr[{name}]' (in a "
                            f"checkout: `make test-trackers` installs all three into .venv); or leave {name} out "
                            "of run.report_to")
    return problems


def numeric_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a metrics.jsonl row a tracker gets: every int or float field under its own name but
    the row's `step` (the tracker's step) and `time` (each tracker stamps its own wall time; trackio
    reserves the name); bools and None (a non-finite value's JSON) are left out."""
    return {k: v for k, v in row.items()
            if k not in ("step", "time") and isinstance(v, int | float) and not isinstance(v, bool)}


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_name(name: str) -> str:
    """A metric or param name as MLflow accepts it (alphanumerics, _ - . space : / only): `@` becomes
    `_at_` (eval/pass@8 -> eval/pass_at_8), any other refused character `_`; names MLflow accepts are
    unchanged."""
    return _MLFLOW_BAD.sub("_", name.replace("@", "_at_"))


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'algo': {'loss': 'grpo'}} -> {'algo.loss': 'grpo'} (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _state(run_dir: Path) -> dict:
    path = run_dir / STATE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError):
        return {}


def _save_state(run_dir: Path, name: str, value: dict) -> None:
    state = _state(run_dir)
    state[name] = value
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / STATE_FILE)


def _say(message: str) -> None:
    print(redact_text(message), file=sys.stderr, flush=True)


class Tracker:
    """One backend's run. Subclasses open it in __init__(run_dir, config, resume) and implement log
    (one metrics.jsonl row's numeric fields at its step), log_config (the resolved config, nested) and
    close (failed: the training raised)."""

    name = "tracker"

    def __init__(self, run_dir: Path, config: Mapping[str, Any] | None, resume: bool):
        self.run_dir = run_dir

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        raise NotImplementedError

    def log_config(self, config: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def close(self, failed: bool = False) -> None:
        raise NotImplementedError


class WandbTracker(Tracker):
    """Weights & Biases, offline unless WANDB_MODE is set: RUN/wandb/offline-run-<time>-<id>/ (WANDB_DIR
    moves it). The id is kept in RUN/trackers.json and a resume reopens it with resume="allow"; each
    process writes its own offline-run folder of that id, and `wandb sync` sends each to that run."""

    name = "wandb"

    def __init__(self, run_dir, config, resume):
        super().__init__(run_dir, config, resume)
        import wandb

        prior = _state(run_dir).get("wandb", {}) if resume else {}
        mode = None if os.environ.get("WANDB_MODE") else "offline"
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT, name=run_dir.name, id=prior.get("id"),
            resume="allow", config=dict(config or {}), mode=mode,
            dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
            settings=wandb.Settings(console="off", silent=True),
        )
        _save_state(run_dir, "wandb", {"id": self.run.id, "project": self.run.project})
        where = Path(self.run.dir).parent if getattr(self.run, "dir", None) else run_dir / "wandb"
        offline = (mode or os.environ.get("WANDB_MODE", "")) in ("offline", "dryrun")
        _say(f"run.report_to: wandb run {self.run.id} ({'offline' if offline else os.environ['WANDB_MODE']}) in "
             f"{where}" + (f"; upload it later with: wandb sync {where}" if offline else ""))

    def log(self, step, metrics):
        self.run.log(dict(metrics), step=int(step))

    def log_config(self, config):
        self.run.config.update(dict(config), allow_val_change=True)

    def close(self, failed=False):
        self.run.finish(exit_code=1 if failed else 0)


class TrackioTracker(Tracker):
    """Trackio's local store: RUN/trackio/<project>.db unless TRACKIO_DIR is set (trackio reads it when
    first imported, so a second run in one process logs where the first did, and says so); TRACKIO_SPACE_ID
    sends it to a Space instead. The run is named after the run directory and a resume continues it by
    name (resume="allow"). Trackio's own lines go to stderr (stdout stays for results)."""

    name = "trackio"

    def __init__(self, run_dir, config, resume):
        super().__init__(run_dir, config, resume)
        os.environ.setdefault("TRACKIO_DIR", str(run_dir / "trackio"))
        import trackio
        from trackio import utils as trackio_utils

        self.project = os.environ.get("TRACKIO_PROJECT") or PROJECT
        with contextlib.redirect_stdout(sys.stderr):
            self.run = trackio.init(project=self.project, name=run_dir.name, config=dict(config or {}),
                                    resume="allow" if resume else "never", embed=False,
                                    auto_log_cpu=False, auto_log_gpu=False)
        where = str(trackio_utils.TRACKIO_DIR)
        _save_state(run_dir, "trackio", {"project": self.project, "name": self.run.name, "dir": where})
        _say(f"run.report_to: trackio run {self.run.name!r} of project {self.project!r} in {where}; see it with: "
             f"TRACKIO_DIR={where} trackio show --project {self.project}")

    def log(self, step, metrics):
        self.run.log(dict(metrics), step=int(step))

    def log_config(self, config):
        self.run.config.update(dict(config))

    def close(self, failed=False):
        from trackio import context_vars

        with contextlib.redirect_stdout(sys.stderr):
            self.run.finish()
        if context_vars.current_run.get() is self.run:  # else trackio's atexit hook finishes it again
            context_vars.current_run.set(None)


class MlflowTracker(Tracker):
    """MLflow through its client (no global active run): sqlite:///RUN/mlflow.db unless MLFLOW_TRACKING_URI
    is set; experiment MLFLOW_EXPERIMENT_NAME or 'rlvr'. The config as params with dotted keys (a resume
    whose config changed a value, e.g. a raised run.steps, records it as the tag `resumed.<key>`: MLflow
    params cannot change). The run id is kept in RUN/trackers.json; a resume continues that run."""

    name = "mlflow"
    MAX_BATCH = 100  # MLflow's limit of params (and of tags) per log_batch; metrics up to 1000

    def __init__(self, run_dir, config, resume):
        super().__init__(run_dir, config, resume)
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        shown = redact_uri(uri)  # what trackers.json keeps and the console shows: no credential
        prior = _state(run_dir).get("mlflow", {}) if resume else {}
        self.run_id = None
        if prior.get("run_id") and prior.get("tracking_uri") in (shown, uri):
            self.client.get_run(prior["run_id"])  # raises when it is gone
            self.run_id = prior["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        if self.run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
            exp = self.client.get_experiment_by_name(name)
            if exp is not None:
                exp_id = exp.experiment_id
            elif uri.startswith("sqlite:///") and not os.environ.get("MLFLOW_TRACKING_URI"):
                exp_id = self.client.create_experiment(name, artifact_location=(run_dir / "mlartifacts").resolve().as_uri())
            else:
                exp_id = self.client.create_experiment(name)
            self.run_id = self.client.create_run(exp_id, run_name=run_dir.name).info.run_id
        _save_state(run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": shown})
        _say(f"run.report_to: mlflow run {self.run_id} in {shown}; see it with: mlflow ui --backend-store-uri "
             f"{shown}" + (" (with the password of MLFLOW_TRACKING_URI)" if shown != uri else ""))
        if config:
            self.log_config(config)

    def log(self, step, metrics):
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        batch = [Metric(mlflow_name(k), float(v), ms, int(step)) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log_config(self, config):
        from mlflow.entities import Param, RunTag

        have = self.client.get_run(self.run_id).data.params
        params, tags = [], []
        for k, v in flatten(config).items():
            key, value = mlflow_name(k), str(v)[:6000]
            if key not in have:
                params.append(Param(key, value))
            elif have[key] != value:
                tags.append(RunTag(f"resumed.{key}", value))
        for i in range(0, len(params), self.MAX_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + self.MAX_BATCH])
        for i in range(0, len(tags), self.MAX_BATCH):
            self.client.log_batch(self.run_id, tags=tags[i:i + self.MAX_BATCH])

    def close(self, failed=False):
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


TRACKERS: dict[str, type[Tracker]] = {"wandb": WandbTracker, "trackio": TrackioTracker, "mlflow": MlflowTracker}
"""Backend name -> its Tracker class (tests put a fake one here)."""


class Trackers:
    """The external trackers of one run, opened at the first config or metrics row (so the backend gets the
    resolved config when its run starts). A tracker that raises is warned about once and dropped; the
    others and metrics.jsonl go on."""

    def __init__(self, run_dir: str | Path, names: Sequence[str], *, resume: bool = False):
        self.run_dir = Path(run_dir)
        self.names = [n for n in names if n in EXTERNAL or n in TRACKERS]
        self.resume = resume
        self.active: list[Tracker] = []
        self.failed: dict[str, str] = {}
        self._opened = not self.names

    def _fail(self, tracker_name: str, what: str, exc: BaseException, step: int | None = None) -> None:
        at = f" at step {step}" if step is not None else ""
        why = redact_text(" ".join(f"{type(exc).__name__}: {exc}".split()))  # one line, no credential
        why = why if len(why) <= 400 else why[:400] + " ..."
        self.failed[tracker_name] = why
        warnings.warn(f"run.report_to={tracker_name}: {what} failed{at} ({why}); this tracker is off for the "
                      "rest of the run, training goes on and metrics.jsonl keeps every row",
                      RuntimeWarning, stacklevel=4)

    def _open(self, config: Mapping[str, Any] | None) -> None:
        self._opened = True
        for name in self.names:
            try:
                self.active.append(TRACKERS[name](self.run_dir, config, self.resume))
            except Exception as exc:  # noqa: BLE001 - a tracker never stops the run
                self._fail(name, "opening the run", exc)

    def _each(self, what: str, call, step: int | None = None) -> None:
        for tracker in list(self.active):
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001
                self.active.remove(tracker)
                self._fail(tracker.name, what, exc, step)
                with contextlib.suppress(Exception):
                    tracker.close(failed=True)

    def log_config(self, config: Mapping[str, Any]) -> None:
        if not self._opened:
            self._open(config)
        else:
            self._each("logging the config", lambda t: t.log_config(config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self._opened:
            self._open(None)
        if metrics:
            self._each("logging metrics", lambda t: t.log(step, metrics), step)

    def close(self, failed: bool = False) -> None:
        active, self.active = self.active, []
        for tracker in active:
            try:
                tracker.close(failed=failed)
            except Exception as exc:  # noqa: BLE001
                self._fail(tracker.name, "closing the run", exc)
