"""A word-level LSTM language model trained by hand (p.data.add_(p.grad, alpha=-lr)) with
clip_grad_norm_, its hidden state carried and detached between batches; the whole model saved
with torch.save after each epoch and loaded back with weights_only and safe_globals."""
import torch
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 1)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        logits = self.decoder(self.drop(out)).view(-1, self.decoder.out_features)
        return nn.functional.log_softmax(logits, dim=1), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        size = self.rnn.hidden_size
        return (w.new_zeros(1, bsz, size), w.new_zeros(1, bsz, size))


torch.manual_seed(1111)
ntokens, bsz, bptt = 50, 4, 8
data = torch.randint(0, ntokens, (200,)).view(bsz, -1).t().contiguous()
model = RNNModel(ntokens, 16, 16)
criterion = nn.NLLLoss()
lr = 20.0
for epoch in range(1, 3):
    model.train()
    hidden = model.init_hidden(bsz)
    for i in range(0, data.size(0) - 1, bptt):
        seq_len = min(bptt, data.size(0) - 1 - i)
        x, target = data[i:i + seq_len], data[i + 1:i + 1 + seq_len].reshape(-1)
        model.zero_grad()
        hidden = tuple(h.detach() for h in hidden)
        output, hidden = model(x, hidden)
        loss = criterion(output, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
    print(f"epoch {epoch} loss {loss.item():.4f}")
    with open("model.pt", "wb") as f:
        torch.save(model, f)
safe = [RNNModel, nn.Dropout, nn.Embedding, nn.LSTM, nn.Linear]
with open("model.pt", "rb") as f, torch.serialization.safe_globals(safe):
    model = torch.load(f)
model.rnn.flatten_parameters()
print("loaded", type(model).__name__)
