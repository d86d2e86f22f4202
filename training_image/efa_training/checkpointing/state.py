"""What a checkpoint restores besides model, optimizer and scheduler: where the run is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerState:
    step: int = 0
    samples_consumed: int = 0  # global data position, see data.SequenceBatches
    tokens_seen: int = 0

    def advance(self, samples: int, tokens: int) -> None:
        """One optimizer step done: `samples` sequences and `tokens` tokens over all ranks."""
        self.step += 1
        self.samples_consumed += samples
        self.tokens_seen += tokens
