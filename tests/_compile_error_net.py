"""A Cell that cannot compile in GRAPH_MODE (try/except in construct); used by test_compiling."""
from mindspore import nn


class GuardedDense(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)

    def construct(self, x):
        try:
            y = self.dense(x)
        except ValueError:
            y = x
        return y
