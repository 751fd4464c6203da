"""Admin commands: ``setup``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import redis
import typer

from streamq.ops import setup as setup_
from streamq.storage import migrate
from streamq.storage.luaload import library

from ..errors import ConfigError
from .common import DEFAULT_URL, JsonOut, RedisUrl, app, client, console, emit_json, error_line


@app.command(rich_help_panel="Admin")
def setup(
    redis_url: RedisUrl = DEFAULT_URL,
    acl: Annotated[Path | None, typer.Option(
        "--acl", file_okay=False, show_default=False,
        help="write fresh random secrets into DIR (DIR/<role>-password for every role and "
             "DIR/web-token, mode 0600; one already there is kept) and DIR/users.acl with "
             "their hashes; contacts no Redis")] = None,
    acl_only: Annotated[bool, typer.Option(
        "--acl-only", help="with --acl: write nothing, print the ACL lines of the passwords "
                           "in DIR/<role>-password")] = False,
    rotate: Annotated[list[str] | None, typer.Option(
        "--rotate", metavar="NAME", show_default=False,
        help="with --acl: replace this secret with a fresh one (a role such as admin, "
             "web-token, or all); the old password stays in DIR/<role>-password.previous, "
             "accepted by users.acl until that file is deleted (repeatable)")] = None,
    plain: Annotated[bool, typer.Option(
        "--plain", help="with --acl: the lines for a server without streamq's module (each "
                        "role then holds the commands its functions run)")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="check the servers and the library, load nothing")] = False,
    allow_eviction: Annotated[bool, typer.Option(
        "--allow-eviction", help="go on although maxmemory-policy may evict keys")] = False,
    json_out: JsonOut = False,
) -> None:
    """Check Redis and load streamq's functions library on every master (admin role); or,
    with --acl DIR, write fresh secrets and the users ACL file (no Redis needed)."""
    if acl_only and acl is None:
        raise ConfigError("--acl-only needs --acl DIR (the directory of the password files)")
    if plain and acl is None:
        raise ConfigError("--plain needs --acl DIR (the directory of the password files)")
    if rotate and (acl is None or acl_only):
        raise ConfigError("--rotate needs --acl DIR, without --acl-only")
    if acl is not None:
        if acl_only:
            typer.echo("\n".join(setup_.acl_lines(acl, module=not plain)))
            return
        write_acl(acl, rotate or [], plain=plain, json_out=json_out)
        return
    setup_.refuse_example_credentials(redis_url)
    c = client(redis_url)
    try:
        reports = setup_.run_setup(c, allow_eviction=allow_eviction, load=not check)
        moved = 0 if check else migrate.move_old_jobs(c)
    except redis.exceptions.NoPermissionError as e:
        raise ConfigError(f"setup needs the admin role (FUNCTION LOAD, INFO, CONFIG GET): "
                          f"Redis said {e}") from None
    finally:
        c.close()
    lib = library()
    if json_out:
        emit_json({"library": {"name": lib.name, "version": lib.version},
                   "nodes": setup_.as_json(reports), "jobs_moved": moved})
        return
    out = console()
    for r in reports:
        before, after = r.library_before, r.library_after or r.library_before
        if before == lib.version:
            did = "up to date"
        elif check:  # nothing was loaded
            did = "missing" if before is None else f"version {before}"
        else:
            did = "loaded" if before is None else f"upgraded from {before}"
        out.print(f"{r.node}: Redis {r.version}, maxmemory-policy {r.policy}, persistence "
                  f"{'+'.join(r.persistence) or 'none'}; library {lib.name} {after or '-'} "
                  f"({did}); module {'loaded' if r.module else 'not loaded'}")
        for w in r.warnings:
            error_line(f"warning: {r.node}: {w}")
    if moved:
        out.print(f"moved {moved} job(s) to this release's key layout (job ids per queue)")
    if check and any(r.library_before != lib.version for r in reports):
        raise typer.Exit(1)


def write_acl(directory: Path, rotate: list[str], *, plain: bool, json_out: bool) -> None:
    """``setup --acl DIR``: the secrets and the users ACL file, then what was done to each
    file (never a secret)."""
    names = setup_.secret_names()
    known = {**{r: f"{r}-password" for r in setup_.password_roles()},
             **{n: n for n in names}}
    unknown = [n for n in rotate if n != "all" and n not in known]
    if unknown:
        raise ConfigError(f"--rotate {unknown[0]}: not a secret; give a role "
                          f"({', '.join(setup_.password_roles())}), {setup_.WEB_TOKEN} or all")
    chosen = list(names) if "all" in rotate else [known[n] for n in rotate]
    report = setup_.write_secrets(directory, rotate=chosen, module=not plain)
    if json_out:
        emit_json(asdict(report))
        return
    for name, did in report.files.items():
        extra = ""
        if did == "rotated" and name != setup_.WEB_TOKEN:
            extra = (f" (the old one kept in {name}{setup_.PREVIOUS}, still accepted by "
                     f"{setup_.ACL_FILE}: delete it and run setup --acl again once every "
                     f"server and client has the new one)")
        typer.echo(f"{directory / name}: {did}{extra}")
    typer.echo(f"{report.acl}: written (the hashes of the passwords above"
               f"{', for a server without the module' if plain else ''})")
    typer.echo(setup_.next_steps(directory))
