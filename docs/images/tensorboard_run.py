import torch
from torch import nn

import torch_sentinel

torch.manual_seed(0)
teacher = torch.randn(16, 4)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=300)
sentinel = torch_sentinel.attach(model, opt, log_dir="runs/mlp")
for step in range(300):
    x = torch.randn(64, 16)
    loss = nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 20 == 19:
        with torch.no_grad():
            xv = torch.randn(256, 16)
            sentinel.observe_validation(nn.functional.cross_entropy(model(xv), (xv @ teacher).argmax(1)))
sentinel.detach()
