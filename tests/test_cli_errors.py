"""Every `mla-lab` subcommand refuses a user's mistake while parsing: exit status 2, the command's own usage,
one error line, no traceback.

"One line" means: stderr is the command's usage (its first line starts "usage: mla-lab <command>", the rest
are the usage's continuation lines) followed by exactly one line "mla-lab <command>: error: <message>", and
nothing else mentions an error.  The commands never run: their run functions are replaced by ones that fail.
"""

import contextlib
import dataclasses
import io
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mla_lab import cli
from mla_lab.core import argtypes, stages

STAGE_IDS = [s.id for s in stages.STAGES]


def _never_runs(name):
    def run(args, argv):
        raise AssertionError(f"mla-lab {name} ran with options it should have refused")

    return run


@pytest.fixture(autouse=True)
def commands_never_run(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", tuple(dataclasses.replace(c, run=_never_runs(c.name)) for c in cli.COMMANDS))


def run(argv):
    """(exit status, stdout, stderr) of `mla-lab argv...` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(list(argv))
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def assert_refused(argv, prog=None):
    """Exit 2, the usage of ``prog`` (default: mla-lab and the command), one error line, no traceback.
    Returns the error's message."""
    prog = prog or f"mla-lab {argv[0]}"
    rc, out, err = run(argv)
    assert "Traceback" not in out + err, (argv, err)
    assert rc == 2, (argv, rc, out, err)
    lines = err.rstrip("\n").split("\n")
    assert lines[0].startswith(f"usage: {prog} "), (argv, err)
    assert lines[-1].startswith(f"{prog}: error: "), (argv, err)
    assert sum("error:" in line for line in lines) == 1, (argv, err)
    assert all(line.startswith(" ") for line in lines[1:-1]), (argv, err)  # the usage's continuation lines
    return lines[-1][len(f"{prog}: error: "):]


# ---- the values the issue found accepted, or answered with a traceback ------------------------

@pytest.mark.parametrize("argv, message", [
    (["profile-target", "hopper", "-1", "9", "8", "1024"], "argument STREAMS: '-1' must be 1 or more"),
    (["profile-target", "hopper", "1", "9", "8", "-5"], "argument PREFIX: '-5' must be 0 or more"),
    (["profile-target", "hopper", "1", "9", "8", "1024", "--page-size", "0"], "argument --page-size: '0' must be 1 or more"),
    (["profile-target", "tensor_core", "1", "9", "8", "1024", "--build", "no_math"],
     "argument --build: no_math swaps a piece of stage wgmma, not of tensor_core"),
    (["profile-target", "hopper", "1", "9", "8", "1024", "--build", "nosuch"],
     "argument --build: no experiment named 'nosuch'; `mla-lab experiments` lists them"),
    (["profile-target", "naive", "1", "9", "8", "1024", "--splits", "4"], "argument --splits: stage naive takes no split"),
    (["profile-target", "tensor_core", "1", "9", "8", "1024", "--splits", "300"],
     "argument --splits: stage tensor_core takes 1 .. 256, got 300"),
    (["profile-target", "hopper", "1", "9", "8", "1024", "--peer", "flashmla"],
     "argument --peer: FlashMLA needs pages of 64 tokens (--page-size 64), not 1"),
    (["check", "--stages", "nosuch"], "argument --stages: invalid choice: 'nosuch'"),
    (["check", "--jobs", "-3"], "argument --jobs: '-3' must be 1 or more"),
    (["resources", "--arch", "abc"], "argument --arch: 'abc' is not a compute capability written major.minor"),
    (["resources", "--arch", "sm_90"], "argument --arch: 'sm_90' is not a compute capability"),
    (["chapters", "execute", "--force", "chapters/nosuch.ipynb"], "argument NOTEBOOK: no such file: 'chapters/nosuch.ipynb'"),
    (["bench", "--heads", "-8"], "argument --heads: '-8' must be 1 or more"),
    (["bench", "--prefix", "-5"], "argument --prefix: '-5' must be 0 or more"),
    (["bench", "--streams", "0"], "argument --streams: '0' must be 1 or more"),
    (["bench", "--page-size", "-64"], "argument --page-size: '-64' must be 1 or more"),
    (["bench", "--rep-ms", "nan"], "argument --rep-ms: 'nan' must be a finite number above 0"),
    (["bench", "--triton-splits", "2000"], "argument --triton-splits: '2000' must be in 1 .. 1024"),
    (["bench", "--stages", "hoper"], "argument --stages: invalid choice: 'hoper'"),
    (["sweep", "--splits", "0"], "argument --splits: '0' must be 1 or more"),
    (["kernel-times", "--calls", "many"], "argument --calls: 'many' is not a whole number"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_the_issue_s_mistakes(argv, message):
    prog = "mla-lab chapters execute" if argv[:2] == ["chapters", "execute"] else None
    assert assert_refused(argv, prog).startswith(message)


def test_resources_refuses_an_arch_nvcc_does_not_know():
    msg = assert_refused(["resources", "--arch", "9.9"])
    assert msg.startswith("argument --arch: this toolkit's nvcc does not compile for 9.9; it takes ")
    assert "9.0" in msg and "12.0" in msg


@pytest.mark.parametrize("name", [c.name for c in cli.COMMANDS] + ["chapters execute"])
def test_an_unknown_option_gets_the_command_s_usage(name):
    argv = name.split() + (SPACE[name][0] if name in SPACE else []) + ["--bogus"]
    assert assert_refused(argv, f"mla-lab {name}") == "unrecognized arguments: --bogus"


def test_a_bad_build_arch_variable_is_one_line(monkeypatch):
    monkeypatch.setenv("MLA_LAB_CUDA_ARCHS", "sm_90")
    monkeypatch.setattr(cli, "COMMANDS", tuple(c if c.name != "build" else dataclasses.replace(c, run=cli._build)
                                               for c in cli.COMMANDS))
    rc, out, err = run(["build"])
    assert rc == 2 and "Traceback" not in out + err
    assert err.strip() == ("mla-lab build: error: MLA_LAB_CUDA_ARCHS='sm_90': 'sm_90' is not a compute capability "
                           "written major.minor, such as 8.0, 9.0 or 12.0; write them separated by ';', e.g. "
                           "\"8.0;8.6;8.9;9.0;12.0\"")


# ---- every option of every subcommand, over the space of bad values ------------------------

def _not_a_number(text):
    return not re.fullmatch(r"\s*[-+]?\d+(\.\d*)?([eE][-+]?\d+)?\s*", text)


def _names():
    from mla_lab.book.explore import PROFILE_PEERS
    from mla_lab.check.suite import PARTS
    from mla_lab.serving.graphs import SECTIONS

    return set(STAGE_IDS) | set(PARTS) | set(SECTIONS) | set(PROFILE_PEERS) | {"hopper"}


VALID_NAMES = _names()
# Words that are no number, no name a choice takes and no option (argparse reads a word starting with "-" as
# an option).
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.:/", min_size=1, max_size=10).filter(
    lambda w: _not_a_number(w) and w not in VALID_NAMES and w.lower() not in ("nan", "inf", "infinity"))
NOT_POSITIVE = st.one_of(st.integers(max_value=0).map(str), WORDS)
NEGATIVE = st.one_of(st.integers(max_value=-1).map(str), WORDS)
NOT_POSITIVE_FLOAT = st.one_of(st.floats(max_value=0.0).map(repr), st.sampled_from(["nan", "inf", "-inf"]), WORDS)
NOT_A_STAGE = WORDS
NOT_AN_ARCH = st.one_of(WORDS, st.sampled_from(["9", "90", "9.0a", "sm_90", "9.10", "0.5", "12"]),
                        st.integers(min_value=1, max_value=999).map(str)).filter(lambda a: argtypes.arch_error(a))
NO_FILE = WORDS.map(lambda w: f"chapters/{w}.nosuch")
NOT_AN_INT = WORDS

SHAPE = {"--streams": NOT_POSITIVE, "--q-len": NOT_POSITIVE, "--heads": NOT_POSITIVE, "--prefix": NEGATIVE,
         "--page-size": NOT_POSITIVE}
# (the words that name the command, valid arguments it needs, {option: bad values}); a positional is named by
# its index in the valid arguments.
SPACE = {
    "build": ([], {}),
    "bench": ([], {**SHAPE, "--stages": NOT_A_STAGE, "--triton-splits": st.one_of(NOT_POSITIVE, st.integers(
        min_value=1025).map(str)), "--rep-ms": NOT_POSITIVE_FLOAT}),
    "verify": ([], {"--stages": NOT_A_STAGE}),
    "resources": ([], {"--arch": NOT_AN_ARCH}),
    "chapters execute": ([], {0: NO_FILE, "--timeout": NOT_POSITIVE}),
    "sweep": ([], {**SHAPE, "--stages": NOT_A_STAGE, "--splits": NOT_POSITIVE, "--rep-ms": NOT_POSITIVE_FLOAT}),
    "kernel-times": ([], {**SHAPE, "--stages": NOT_A_STAGE, "--calls": NOT_POSITIVE}),
    "profile-target": (["tensor_core", "1", "9", "8", "1024"], {
        0: NOT_A_STAGE, 1: NOT_POSITIVE, 2: NOT_POSITIVE, 3: NOT_POSITIVE, 4: NEGATIVE, "--splits": NOT_POSITIVE,
        "--page-size": NOT_POSITIVE, "--calls": NOT_POSITIVE, "--peer": WORDS, "--build": WORDS}),
    "check": ([], {"--stages": NOT_A_STAGE, "--parts": WORDS, "--jobs": NOT_POSITIVE, "--seed": NOT_AN_INT}),
    "graphs": ([], {"--sections": WORDS}),
    "experiments": ([], {"--stage": NOT_A_STAGE}),
}


def test_the_space_covers_every_command_and_option():
    assert set(SPACE) == {c.name for c in cli.COMMANDS if c.name != "chapters"} | {"chapters execute"}
    ap = cli.parser()
    for name, (_, options) in SPACE.items():
        sub = cli._deepest(ap, name.split())
        taking = {o for a in sub._actions if a.option_strings and a.nargs != 0 and a.dest != "help"
                  for o in a.option_strings if o.startswith("--")}
        named = {o for o in options if isinstance(o, str)}
        # every option that takes a value has bad values here, except those where any value is fine
        assert taking - named <= {"--out"}, (name, taking - named)


@st.composite
def bad_call(draw):
    """A command, valid arguments, then one value spoiled or one unknown option added."""
    name = draw(st.sampled_from(sorted(SPACE)))
    valid, options = SPACE[name]
    argv = list(valid)
    choices = list(options) + ["unknown"]
    what = draw(st.sampled_from(choices))
    if what == "unknown":
        argv.insert(draw(st.integers(0, len(argv))), "--zz" + draw(st.text(alphabet="abcxyz", max_size=5)))
    elif isinstance(what, int):
        if argv:
            argv[what] = draw(options[what])
        else:  # a positional with no valid default (chapters' notebooks): given alone
            argv = [draw(options[what])]
    else:
        argv += [what, draw(options[what])]
    return name.split() + argv, f"mla-lab {name}"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_call())
def test_every_bad_value_is_one_line_and_exit_2(call):
    argv, prog = call
    assert_refused(argv, prog)
