"""What every kfleet command shares: the global options (`Globals`, accepted
before the command through the meta app `app` and after it on every command),
the `commands` App the command modules register on, and `_run`, which loads
the kubeconfig, runs one command under Trio with a `Client` and maps errors to
kubectl's messages and exit codes.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any

import httpx
import trio
from cyclopts import App, Parameter

import fleet
from fleet.client.apply import ApplyError
from fleet.client.discovery import ResourceNotFound
from fleet.client.errors import explain
from fleet.client.kubeconfig import ClientConfig, KubeconfigError, load_kubeconfig
from fleet.client.manifests import ManifestError
from fleet.client.rest import ApiException, Client


@Parameter(name="*")
@dataclass(frozen=True)
class Globals:
    """Options every command accepts."""

    kubeconfig: Annotated[str | None, Parameter(help="Path to the kubeconfig file.")] = None
    context: Annotated[str | None, Parameter(help="The kubeconfig context to use.")] = None
    namespace: Annotated[str | None, Parameter(
        name=["--namespace", "-n"], help="Namespace (default: the context's, else 'default').",
    )] = None


HELP = "Control a Fleet cluster (a kubectl-compatible CLI)."

# `commands` holds the subcommands; `app` (defined at the end of the module)
# is its meta app, which also takes the global options before the command
# name.  Mount `app` (as `fleet ctl` does); add new commands to `commands`.
commands = App(name="kfleet", help=HELP, version=fleet.__version__, version_flags=[])

# Options given before the command name, set by the meta launcher for the
# duration of one invocation; per-command options win over these.
_leading = Globals()


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _out(msg: str) -> None:
    print(msg, flush=True)


def api_error_text(exc: ApiException) -> str:
    """`Error from server (NotFound): pods "x" not found`, as kubectl prints it."""
    return f"Error from server ({exc.reason}): {exc.message}"


@dataclass(frozen=True)
class Session:
    config: ClientConfig
    namespace: str


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _run(g: Globals | None, fn: Callable[[Client, Session], Awaitable[int]]) -> int:
    """Load the kubeconfig, run `fn` under Trio with a Client, map errors to exit codes."""
    g = g or Globals()
    merged = replace(_leading, **{k: v for k, v in vars(g).items() if v is not None})
    try:
        config = load_kubeconfig(merged.kubeconfig, merged.context)
    except KubeconfigError as exc:
        _err(f"error: {exc}")
        return 1
    session = Session(config, merged.namespace or config.namespace)

    async def main() -> int:
        async with Client(config) as client:
            return await fn(client, session)

    try:
        return trio.run(main)
    except KeyboardInterrupt:
        return 130
    except (Exception, BaseExceptionGroup) as raised:
        exc = _unwrap(raised)  # a nursery wraps errors in groups; report the one inside
        if isinstance(exc, ApiException):
            _err(api_error_text(exc))
        elif isinstance(exc, ResourceNotFound | ManifestError | ApplyError):
            _err(f"error: {exc}")
        elif isinstance(exc, httpx.TransportError):
            _err(f"Unable to connect to the server at {config.server}: {explain(exc)}")
        elif isinstance(exc, KeyboardInterrupt):
            return 130
        else:
            raise
        return 1


# -- the meta app: global options before the command name ----------------------------


@commands.meta.default
def _launcher(
    *tokens: Annotated[str, Parameter(show=False, allow_leading_hyphen=True)],
    g: Globals | None = None,
) -> Any:
    """Accept the global options before the command name, then run the command."""
    global _leading
    previous = _leading
    _leading = g or Globals()
    try:
        return commands(tokens)
    finally:
        _leading = previous


app = commands.meta
app.help = HELP
