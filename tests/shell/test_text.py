"""What the shell's user typed, split into statements and dot commands (no sockets)."""

from __future__ import annotations

import pytest

from flight.shell.text import Command, complete, items


def test_statements_end_at_semicolons_outside_strings_names_and_comments() -> None:
    text = "select ';' as x; select 2 -- a comment;\n; select \"a;b\" from t /* ; */ ;"
    assert items(text) == (["select ';' as x", "select 2 -- a comment;", 'select "a;b" from t /* ; */'], "")


def test_an_unfinished_statement_is_left_over_and_not_complete() -> None:
    assert items("select 1;\nselect 2\nfrom t") == (["select 1"], "select 2\nfrom t")
    assert not complete("select 2\nfrom t")
    assert complete("select 2\nfrom t;")


def test_an_open_string_or_comment_waits_but_finished_statements_before_it_run() -> None:
    assert items("select 1; select 'a;b") == (["select 1"], "select 'a;b")
    assert not complete("select 'it''s;")
    assert not complete("select 1 /* ; ")
    assert complete("select 'it''s';")


def test_dot_commands_are_lines_with_their_words() -> None:
    assert items(".tables\n.schema  Orders\n.maxrows 10;") == (
        [Command("tables", ()), Command("schema", ("Orders",)), Command("maxrows", ("10",))], "")
    assert complete(".tables")


@pytest.mark.parametrize("word", ["quit", "exit", "EXIT;", "\\q"])
def test_quit_words_quit(word: str) -> None:
    assert items(word) == ([Command("quit", ())], "")


def test_blank_and_comment_only_input_runs_nothing() -> None:
    assert items("") == ([], "")
    assert items("  \n-- just a note\n") == ([], "")
    assert complete("")


def test_sparks_backquoted_names_hold_semicolons() -> None:
    assert items("select `a;b` from t;", "spark") == (["select `a;b` from t"], "")
