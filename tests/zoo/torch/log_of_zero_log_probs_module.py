"""A classifier whose forward returns log-probabilities for ``nn.NLLLoss``, written as
``torch.log(torch.softmax(logits, -1))`` instead of ``log_softmax``.

The five clusters are well separated and Adam with a large step keeps pushing the logits apart.
For many updates the loss falls; once the gap between the top logit and the last one passes
about 104, float32's softmax rounds that class's probability to exactly 0 and the log inside the
model's forward is -inf. NLLLoss reads only the true class, so the loss is still finite, but the
log's gradient (1/p at p = 0) turns every weight's gradient NaN.
"""

import os

import torch
from torch import nn

CAUSE = "log_of_zero"
OP = "log"
MODULE = "Classifier"


class Classifier(nn.Module):
    def __init__(self, features=8, classes=5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):
        return torch.log(torch.softmax(self.net(x), dim=-1))


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
centers = 10.0 * torch.randn(5, 8)
y = torch.randint(0, 5, (2000,))
X = centers[y] + 0.5 * torch.randn(2000, 8)
model = Classifier()
loss_fn = nn.NLLLoss()
opt = torch.optim.Adam(model.parameters(), lr=0.05)
for epoch in range(20):
    for i in range(0, len(X), 100):
        xb, yb = X[i : i + 100], y[i : i + 100]
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    print(epoch, loss.item())
print("done", loss.item())
