"""Admin commands: ``setup``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import redis
import typer

from .. import setup as setup_
from ..errors import ConfigError
from ..luaload import library
from .common import DEFAULT_URL, JsonOut, RedisUrl, app, client, console, emit_json, error_line


@app.command(rich_help_panel="Admin")
def setup(
    redis_url: RedisUrl = DEFAULT_URL,
    acl: Annotated[Path | None, typer.Option(
        "--acl", file_okay=False, show_default=False,
        help="print the ACL file lines of every role, each password read from "
             "DIR/<role>-password and stored hashed")] = None,
    acl_only: Annotated[bool, typer.Option(
        "--acl-only", help="only print the ACL lines (with --acl): do not contact Redis")
    ] = False,
    plain: Annotated[bool, typer.Option(
        "--plain", help="with --acl: the lines for a server without streamq's module (each "
                        "role then holds the commands its functions run)")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="check the servers and the library, load nothing")] = False,
    allow_eviction: Annotated[bool, typer.Option(
        "--allow-eviction", help="go on although maxmemory-policy may evict keys")] = False,
    json_out: JsonOut = False,
) -> None:
    """Check Redis, load streamq's functions library on every master (admin role), and
    print the roles' ACL lines."""
    if acl_only and acl is None:
        raise ConfigError("--acl-only needs --acl DIR (the directory of the password files)")
    if plain and acl is None:
        raise ConfigError("--plain needs --acl DIR (the directory of the password files)")
    lines = setup_.acl_lines(acl, module=not plain) if acl is not None else []
    if acl_only:
        typer.echo("\n".join(lines))
        return
    c = client(redis_url)
    try:
        reports = setup_.run_setup(c, allow_eviction=allow_eviction, load=not check)
    except redis.exceptions.NoPermissionError as e:
        raise ConfigError(f"setup needs the admin role (FUNCTION LOAD, INFO, CONFIG GET): "
                          f"Redis said {e}") from None
    finally:
        c.close()
    lib = library()
    if json_out:
        emit_json({"library": {"name": lib.name, "version": lib.version},
                   "nodes": setup_.as_json(reports), "acl": lines})
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
    if check and any(r.library_before != lib.version for r in reports):
        raise typer.Exit(1)
    for line in lines:
        typer.echo(line)
