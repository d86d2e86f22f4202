"""The gpt workload: a GPT-style decoder trained with DDP or FSDP2 (strategies ddp and fsdp), with tensor and
pipeline parallelism, under torchrun.

sizes.py         the named sizes (MODEL_SIZES), parameter counts and FLOPs per token, without torch
model.py         the decoder (re-exports sizes.py's sizes)
builders.py      the model as trained: DDP, FSDP2 or plain on XLA; AdamW; warm-up and cosine schedule
parallel.py      tensor parallelism on the (pp, dp, tp) device mesh; the gradient norm across meshes
pipeline.py      pipeline parallelism: each stage's layers, the 1F1B schedule, the shared embedding kept equal
data.py          token shards and deterministic, resumable batches
prepare_data.py  `prepare-data`: text files to token shards (byte-level tokenizer)
sample.py        a seeded toy corpus for tests and the local run
preflight.py     what it refuses before start: data, vocabulary, a diverged repeat, the checkpoint folder
trainer.py       Trainer: train_step and fit, the summary
meter.py         one step as every rank agrees on it; the metrics lines and the summary's figures
run.py           the workload's `train`: pre-flight, the Trainer, the process group always torn down
saved_model.py   a model from a checkpoint on disk, verified like a resume (validation and --init-from)
evaluate.py      validation: holdout loss (val_loss)
"""
