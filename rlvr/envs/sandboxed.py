"""Tool execution in rlvr's code sandbox (rlvr.rewards.code.sandbox): a fresh box per call
(temp dirs, unprivileged uid slot as root, network/PID/IPC namespaces, Landlock, seccomp,
rlimits or a cgroup, wall-clock kill), torn down after the call. Nothing an agent writes runs in
the trainer's process."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.envs.base import valid_text
from rlvr.rewards.code.sandbox import Box, SandboxLimits, run_processes

TOOL_LIMITS = SandboxLimits(wall_s=5.0, cpu_s=3, memory_mb=256, output_bytes=64 << 10)


@dataclass
class ToolRun:
    stdout: str
    stderr: str
    returncode: int | None
    killed: str | None  # "timeout" / "output" / None
    flags: list[tuple[str, str]]  # the sandbox's own integrity flags (network, file_write_outside, ...)
    leftovers: int = 0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.killed is None


def run_python(code: str, stdin: str = "", limits: SandboxLimits = TOOL_LIMITS) -> ToolRun:
    """Run `code` as a script in a fresh sandbox box; its stdin is `stdin`. Text UTF-8 cannot encode
    (a lone surrogate in model text) is replaced by '?' first: the call runs, it never raises."""
    box = Box(valid_text(code))
    leftovers = 0
    try:
        (r,) = run_processes([{"box": box, "mode": "script", "limits": limits,
                               "stdin": valid_text(stdin).encode("utf-8")}],
                             limits.wall_s)
    finally:
        leftovers = box.close()
    return ToolRun(stdout=r.stdout.decode("utf-8", "replace"), stderr=r.stderr.decode("utf-8", "replace"),
                   returncode=r.returncode, killed=r.killed, flags=list(r.flags), leftovers=leftovers)
