"""A training loop that saves PyTorch DCP checkpoints to stage's ckpt_root
and resumes from the step `stage resume` chose (train.sbatch), or asks for
one itself when run alone."""
import os, torch, torch.distributed.checkpoint as dcp
import stage

ROOT = os.environ.get("CKPT_ROOT", "/var/lib/stage/ckpt") + "/demo"
model = torch.nn.Linear(512, 512)
opt = torch.optim.AdamW(model.parameters())
start, path = 0, os.environ.get("RESUME_FROM")
if path is None:                                   # run alone (one process): ask here
    path = "" if os.environ.get("FRESH") else stage.resume("demo")["path"]
if path:
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    start = int(path.rsplit("-", 1)[1])
for step in range(start + 1, start + 201):
    loss = model(torch.randn(64, 512)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0:
        path = f"{ROOT}/step-{step}"
        dcp.save({"model": model.state_dict(), "opt": opt.state_dict()}, checkpoint_id=path)
        stage.commit(path)                         # manifest and copies to the partners, async
