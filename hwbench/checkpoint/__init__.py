"""Checkpoints: their folders and manifest, without torch (folders); the native engine's
state through torch.distributed.checkpoint (native); the DeepSpeed engines' through
DeepSpeed's own save and load (deepspeed); and checkpoints in a run: where it resumes,
when it saves, what each save and load cost (run). docs/checkpoints.md."""
