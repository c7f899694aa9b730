"""A training loop that saves PyTorch DCP checkpoints to stage's ckpt_root
and resumes from the newest step that verifies on the cluster."""
import os, torch, torch.distributed.checkpoint as dcp
import stage

ROOT = os.environ.get("CKPT_ROOT", "/var/lib/stage/ckpt") + "/demo"
model = torch.nn.Linear(512, 512)
opt = torch.optim.AdamW(model.parameters())
steps = sorted((d for d in os.listdir(ROOT) if d.startswith("step-")), key=lambda d: int(d[5:])) \
    if os.path.isdir(ROOT) else []
start = 0
for d in reversed(steps):                          # the newest step every node holds intact
    try:
        stage.verify(f"{ROOT}/{d}", cluster=True)
    except stage.StageFailed:
        continue
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    dcp.load(state, checkpoint_id=f"{ROOT}/{d}")
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); start = int(d[5:])
    break
for step in range(start + 1, start + 201):
    loss = model(torch.randn(64, 512)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0:
        path = f"{ROOT}/step-{step}"
        dcp.save({"model": model.state_dict(), "opt": opt.state_dict()}, checkpoint_id=path)
        stage.commit(path)                         # manifest and copies to the partners, async
