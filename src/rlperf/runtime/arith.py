"""A tokenizer-free arithmetic task for the reference runtime: prompts end with ``a + b =`` and a
rule-based verifier scores the generated token ids.

The lowest token ids that are not special tokens stand for the numbers ``0``..``max_number``
(one token per number, as a tokenizer with whole-number tokens), then ``+`` and ``=``; every
other id is *filler*. Operands are drawn from ``0..max_number // 2`` so every sum has a token.
A prompt of ``L`` tokens is ``L - 4`` random filler ids followed by ``a + b =``, so prompt
lengths follow the workload's distribution exactly.

Reward (rule-based, as R1-Zero's accuracy + format rewards, algorithms.md §3.2): the answer is
the first number token of the response; 1.0 if it equals ``a + b``, ``format_reward`` if the
response holds a number that is wrong, 0.0 if it holds none. With a small vocabulary the format
term gives a randomly initialized policy rewards that differ within a group, so the advantages
(and the gradients) are not all zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlperf.errors import SpecError

QUESTION_TOKENS = 4  # a + b =
MAX_NUMBER = 198  # operands 0..99


@dataclass(frozen=True)
class ArithVocab:
    numbers: tuple[int, ...]  # numbers[k] is the id of the number k
    plus: int
    equals: int
    filler: tuple[int, ...]  # ids that carry no meaning
    eos: int

    @classmethod
    def for_model(cls, vocab_size: int, special_ids: Sequence[int], eos: int) -> ArithVocab:
        specials = set(special_ids)
        free = [i for i in range(vocab_size) if i not in specials]
        k = min(MAX_NUMBER + 1, len(free) - 3)
        if k < 3:
            raise SpecError("model.vocab_size", f"{vocab_size} leaves too few ordinary token ids", ">= 6 + special tokens")
        return cls(tuple(free[:k]), free[k], free[k + 1], tuple(free[k + 2 :]), eos)

    @property
    def max_operand(self) -> int:
        return (len(self.numbers) - 1) // 2

    def answer(self, response: Sequence[int]) -> int | None:
        """The first number token of ``response`` as its value (None if there is none)."""
        value = {tok: n for n, tok in enumerate(self.numbers)}
        for tok in response:
            n = value.get(int(tok))
            if n is not None:
                return n
        return None


def make_prompt(rng: np.random.Generator, length: int, vocab: ArithVocab) -> tuple[list[int], int]:
    """A prompt of exactly ``length`` ids ending with ``a + b =``, and the answer ``a + b``."""
    if length < QUESTION_TOKENS:
        raise SpecError("workload.prompt_length", f"{length} tokens cannot hold a question", f">= {QUESTION_TOKENS}")
    a, b = (int(x) for x in rng.integers(0, vocab.max_operand + 1, size=2))
    question = [vocab.numbers[a], vocab.plus, vocab.numbers[b], vocab.equals]
    filler = rng.choice(np.asarray(vocab.filler), size=length - QUESTION_TOKENS).tolist()
    return [int(t) for t in filler] + question, a + b


def score(response: Sequence[int], answer: int, vocab: ArithVocab, format_reward: float) -> float:
    got = vocab.answer(response)
    if got is None:
        return 0.0
    return 1.0 if got == answer else format_reward
