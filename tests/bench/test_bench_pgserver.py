"""bench/pgserver.py's ``add_server_options``: the benches that pick their server with
``--private-server`` (and ``--fast-server``) declare them through it, alike."""

from __future__ import annotations

import argparse

import pytest

from tests.bench.scripts import load_bench

pgserver = load_bench("pgserver")

SCRIPTS = {
    "admin_search": False,
    "async_jobs": False,
    "bulk_actions": False,
    "cost_model": False,
    "enqueue_split": True,
    "pgqueuer_drain": False,
    "workflows": False,
}
"""The scripts with a ``build_parser`` (bench/idle.py builds its parser in ``main``) and
whether they have ``--fast-server``."""


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        option: action
        for action in parser._actions
        for option in action.option_strings
        if option in ("--private-server", "--fast-server")
    }


def test_the_options_and_their_defaults() -> None:
    parser = argparse.ArgumentParser()
    pgserver.add_server_options(parser)
    assert list(options(parser)) == ["--private-server"]
    args = parser.parse_args([])
    assert args.private_server is False and not hasattr(args, "fast_server")
    assert parser.parse_args(["--private-server"]).private_server is True

    parser = argparse.ArgumentParser()
    pgserver.add_server_options(parser, fast=True)
    assert list(options(parser)) == ["--private-server", "--fast-server"]
    args = parser.parse_args(["--fast-server"])
    assert (args.private_server, args.fast_server) == (False, True)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_bench_declares_them_through_it(name: str) -> None:
    shared = argparse.ArgumentParser()
    pgserver.add_server_options(shared, fast=SCRIPTS[name])
    ours = options(load_bench(name).build_parser())
    theirs = options(shared)
    assert list(ours) == list(theirs)
    for option, action in ours.items():
        assert (action.dest, action.default, action.help) == (
            theirs[option].dest,
            theirs[option].default,
            theirs[option].help,
        )
