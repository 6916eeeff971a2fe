"""The launch-script reader follows bash's expansion rules for the trainer's command line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rlperf.errors import SpecError
from rlperf.frameworks.shell_script import read_launch_script


def _is_trainer(token: str) -> bool:
    return token.endswith("trainer.main")


def args_of(script: str, **env: str) -> tuple[str, ...]:
    return read_launch_script(script, _is_trainer, env).invocation.args


SCRIPT = r"""#!/usr/bin/env bash
set -xeuo pipefail
export N=${N:-4}          # a comment
PROMPT=$((1024 * 2))
name='it''s'
arr=(--a "b c"
     # a comment inside an array
     --d)
if [ "$N" = "4" ]; then
    mode=four
elif [ "$N" == "8" ]; then
    mode=eight
else
    mode=other
fi
ray job submit --address="http://x:8265" \
    -- python3 -m trainer.main \
    n=$N p=${PROMPT} x="${UNSET:-dflt}" "${arr[@]}" name=$name mode=$mode "$@" \
    q=$(( (PROMPT + 1) / 2 )) 2>&1 | tee log.txt
"""


def test_expansions_as_bash_would() -> None:
    assert args_of(SCRIPT) == (
        "n=4", "p=2048", "x=dflt", "--a", "b c", "--d", "name=its", "mode=four", "q=1024",
    )


def test_environment_reaches_defaults_but_not_plain_assignments() -> None:
    args = args_of(SCRIPT, N="8", PROMPT="7")
    assert args[:2] == ("n=8", "p=2048") and "mode=eight" in args


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
def test_matches_bash_on_the_example() -> None:
    """bash itself, with the trainer replaced by a printer of its arguments."""
    printer = SCRIPT.replace("ray job submit --address=\"http://x:8265\" \\\n    -- python3 -m trainer.main", "printf '%s\\n'")
    printer = printer.replace(" 2>&1 | tee log.txt", "").replace("set -xeuo pipefail", "")
    out = subprocess.run(["bash", "-c", printer], capture_output=True, text=True, timeout=10, check=True, env={"PATH": "/usr/bin:/bin"})
    assert tuple(out.stdout.splitlines()) == args_of(SCRIPT)


def test_command_substitution_is_named_not_run() -> None:
    reading = read_launch_script('D=$(dirname "$0")\npython -m trainer.main out=$D/x `date`', _is_trainer)
    assert reading.invocation.args == ("out=$(...)/x", "$(...)")
    assert any('$(dirname "$0")' in w for w in reading.warnings) and any("`date`" in w for w in reading.warnings)


def test_unset_variables_are_empty_and_named() -> None:
    reading = read_launch_script("python -m trainer.main a=${MISSING}b", _is_trainer)
    assert reading.invocation.args == ("a=b",)
    assert any("MISSING" in w and "--set MISSING=" in w for w in reading.warnings)


def test_bash_c_string_inside_srun_is_read() -> None:
    script = 'srun -w "$node" bash -c \\\n  "pip install x && python3 -m trainer.main --k 1 --j=\\"2\\"" &>> log'
    assert args_of(script) == ("--k", "1", "--j=2")


def test_loops_are_skipped_and_positional_defaults_used() -> None:
    script = "for i in 1 2; do\n  x=$i\ndone\nENGINE=${1:-vllm}\npython3 -m trainer.main e=$ENGINE x=${x:-none}"
    reading = read_launch_script(script, _is_trainer)
    assert reading.invocation.args == ("e=vllm", "x=none")
    assert any("'for' block" in w for w in reading.warnings)


def test_a_trainer_inside_a_loop_is_read_from_its_first_pass() -> None:
    # Sweep scripts launch the trainer in a loop; the first pass is what a user asks about.
    script = ("for m in a b; do\n  for n in 4 8\n  do\n    python3 -m trainer.main m=$m n=$n\n  done\ndone\n"
              "while true; do echo; done")
    reading = read_launch_script(script, _is_trainer)
    assert reading.invocation.args == ("m=a", "n=4")
    assert any("'for' loop on line 1" in w and "m=a" in w for w in reading.warnings)
    assert not any("'for' block on line 1 skipped" in w for w in reading.warnings)
    assert any("'while' block" in w for w in reading.warnings)
    assert args_of("while true; do\n  python3 -m trainer.main k=1 && break\ndone") == ("k=1",)


def test_a_trainer_outside_loops_wins_over_one_inside() -> None:
    assert args_of("for s in 1 2; do python3 -m trainer.main s=$s; done\npython3 -m trainer.main top=1") == ("top=1",)


def test_a_line_continued_inside_double_quotes_joins() -> None:
    # verl's gspo/sapo examples build override lists as "a=1 \\<newline> b=2"; bash drops the \\<newline>.
    assert args_of('A="x=1 \\\n    y=2"\npython3 -m trainer.main $A') == ("x=1", "y=2")


def test_values_from_unset_variables_are_traced_to_them() -> None:
    script = ("N=${SLURM_NNODES}\nARR=(\n  k=$(((4 + 4) / sp))\n)\n"
              "python3 -m trainer.main n=$N ${ARR[@]} --nodes $M s=${SET:-1}")
    reading = read_launch_script(script, _is_trainer)
    assert dict(reading.unset) == {"n": ("SLURM_NNODES",), "k": ("sp",), "nodes": ("M",)}
    line = str(reading.explain(SpecError("trainer.n", "x")))
    assert line == "trainer.n: x"  # a field no unset variable went into is left alone
    line = str(reading.explain(SpecError("--nodes", "expected an integer, got ''")))
    assert "$M" in line and "--set M=VALUE" in line


def test_no_invocation_is_one_line_error() -> None:
    with pytest.raises(SpecError, match="no trainer invocation"):
        read_launch_script("echo hello", _is_trainer)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
@pytest.mark.parametrize("word", [
    "${X:-'a b'}", '"${X:-"${H}/v"}"', "${H:+set}${X:+no}", "a\\ b", "'$H'\"$H\"", "${arr[1]}", '"${arr[@]}"',
    "${#arr[@]}", "$((H2 * (3 + 1) / 3))", "${X:=dflt}$X", "pre${H}post",
])
def test_words_match_bash(word: str) -> None:
    setup = "H=/home/u\nH2=7\narr=(one 'two three' four)\n"
    out = subprocess.run(["bash", "-c", f"{setup}printf '%s\\n' {word}"], capture_output=True, text=True, timeout=10, check=True)
    assert tuple(out.stdout.splitlines()) == args_of(f"{setup}python -m trainer.main {word}")


@pytest.mark.parametrize("token, runs_verl", [
    ("verl.trainer.main_ppo", True), ("recipe.dapo.main_dapo", True), ("main_ppo_split.py", True),
    ("examples/split_placement/main_ppo_split.py", True), ("main_ppo_split", False), ("train.py", False),
    ("verl.trainer.main_generation", False), ("verl.trainer.main_eval", False),  # no RL: named, not imported
])
def test_verl_entry_points_include_copies_of_main_ppo(token: str, runs_verl: bool) -> None:
    from rlperf.frameworks.verl_script import is_verl_entry

    assert is_verl_entry(token) is runs_verl



HEREDOCS = r"""cat > get_model.py << EOF
x = "it's (unbalanced" $UNQUOTED
EOF
read -r -d '' cmd <<EOF
--a 1 \
   --b "$N"
EOF
cat <<-'LITERAL' >/dev/null
	don't $(run) this
	LITERAL
arr=(
    # the model's config (latest TE=2.10) isn't read here
    x=1
)
python3 -m trainer.main $cmd "${arr[@]}" \
    last=2 \
"""


def test_here_documents_array_comments_and_a_final_continuation() -> None:
    # The here-documents' lines were read as commands (an apostrophe swallowed the script), a
    # quote in an array's comment did too, and the final backslash became an argument.
    # quotes inside a here-document are its text: bash passes '"5"'
    assert args_of(HEREDOCS + "\\", N="5") == ("--a", "1", "--b", '"5"', "x=1", "last=2")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
def test_here_documents_match_bash(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"  # a file: bash drops its final backslash (bash -c keeps it)
    script.write_text(HEREDOCS.replace("python3 -m trainer.main", "printf '%s\\n'") + "\\")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10, check=True,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "N": "5"})
    assert tuple(out.stdout.splitlines()) == args_of(HEREDOCS + "\\", N="5")


def test_a_backslash_followed_by_blanks_cuts_the_command_and_says_where() -> None:
    # bash reads "\ " as an escaped blank and the newline then ends the command: the lines after
    # it are other commands (verl examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh). The import
    # then said only "actor_rollout_ref.model.path: missing".
    script = "python3 -m trainer.main \\\n    a.x=1 \\  # a comment\n    b.y=2 \\\n    c.z=3\n"
    reading = read_launch_script(script, _is_trainer)
    assert reading.invocation.args == ("a.x=1", " ") and reading.cut_at == 2
    assert any(w.startswith("line 2: the trainer's command ends here, but the next line reads as one of its") for w in reading.warnings)
    err = reading.explain(SpecError("model.path", "missing"))
    assert "the trainer's command ends on line 2" in str(err)
    assert read_launch_script(script.replace("\\  # a comment", "\\"), _is_trainer).cut_at is None


def test_a_missing_line_continuation_is_named_but_not_an_assignment_after_the_command() -> None:
    script = "python3 -m trainer.main \\\n    a.b=1\n    c.d=2 \\\n    --e 3\n"
    reading = read_launch_script(script, _is_trainer)
    assert reading.invocation.args == ("a.b=1",) and reading.cut_at == 2
    fine = "if [ -n x ]; then\n    python3 -m trainer.main \\\n        a.b=1\n    STATUS=$?\nfi\n"
    assert read_launch_script(fine, _is_trainer).cut_at is None


CONTINUED = "A=ab\\\ncd\npython3 -m trainer.main --config-name='x.yaml'\\\n    k=\"v\"\\\n  tail=${A}\\\n1\n"


def test_a_line_continuation_inside_a_word_joins_it() -> None:
    # It left a newline in the word: --config-name='ppo_megatron_trainer.yaml'\<newline> gave the
    # config name "ppo_megatron_trainer.yaml\n" (125 distinct verl scripts).
    assert args_of(CONTINUED) == ("--config-name=x.yaml", "k=v", "tail=abcd1")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
def test_a_line_continuation_inside_a_word_matches_bash() -> None:
    printer = CONTINUED.replace("python3 -m trainer.main", "printf '%s\\n'")
    out = subprocess.run(["bash", "-c", printer], capture_output=True, text=True, timeout=10, check=True)
    assert tuple(out.stdout.splitlines()) == args_of(CONTINUED)


def test_sourced_files_and_eval_are_read(tmp_path: Path) -> None:
    # Both were skipped: "source ./env.sh" left its variables unset, and the trainer launched by
    # eval "python3 -m ... $ARGS" was "no trainer invocation found".
    (tmp_path / "env.sh").write_text("MODEL=Qwen/Qwen2.5-3B\nexport N=4\n")
    script = "source ./env.sh\nARGS=\"m=$MODEL n=$N\"\neval \"python3 -m trainer.main $ARGS\"\n"
    reading = read_launch_script(script, _is_trainer, base=tmp_path)
    assert reading.invocation.args == ("m=Qwen/Qwen2.5-3B", "n=4") and reading.environment["N"] == "4"
    missing = read_launch_script(". ./nope.sh\npython3 -m trainer.main a=1\n", _is_trainer, base=tmp_path)
    assert any(w.startswith("'source ./nope.sh' on line 1 not read") for w in missing.warnings)
    computed = read_launch_script('D=$(cd "$(dirname "$0")" && pwd)\nsource "$D/env.sh"\npython3 -m trainer.main m=$MODEL\n',
                                  _is_trainer, base=tmp_path)
    assert computed.invocation.args == ("m=Qwen/Qwen2.5-3B",)
    absolute = read_launch_script(f"source {tmp_path / 'env.sh'}\npython3 -m trainer.main a=1\n", _is_trainer, base=tmp_path)
    assert any("not read (not a file beside the script)" in w for w in absolute.warnings)
