"""A Hugging Face transformers Trainer with the usual profiler recipe (a TrainerCallback that steps a
torch.profiler.profile with tensorboard_trace_handler), on a tiny GPT-2 made from a config (nothing
downloaded): ``python transformers_trainer.py OUT_DIR`` (the traces go to OUT_DIR/tb)."""

import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class ProfilerStep(TrainerCallback):
    def __init__(self, prof: torch.profiler.profile) -> None:
        self.prof = prof

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.prof.step()


def main(out: str) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=os.path.join(out, "run"), per_device_train_batch_size=4, max_steps=4,
                             report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                             disable_tqdm=True)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(os.path.join(out, "tb")),
    ) as prof:
        trainer = Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.add_callback(ProfilerStep(prof))
        trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])
