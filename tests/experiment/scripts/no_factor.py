"""Reports to a Monitor but never reads nanscope.experiment.lr_factor()."""

import nanscope

mon = nanscope.Monitor(write=False)
for step in range(100):
    mon.update(1.0 / (step + 1), lr=0.1)
