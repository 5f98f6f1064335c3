"""A tiny single-process training job on the checkpoint session: what the checkpoint tests and the
agent's metrics tests train when the model itself does not matter."""

from __future__ import annotations


class Counter:
    """An extra_state object: a data-loader position."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, sd: dict) -> None:
        self.position = int(sd["position"])


class TinyJob:
    """A single-process training job with model, AdamW, dropout, python RNG and a data position."""

    def __init__(
        self,
        uri: str,
        *,
        job_id: str = "job",
        control_dir: str | None = None,
        local_dir: str | None = None,
        width: int = 16,
        **session_kwargs,
    ) -> None:
        import random

        import torch

        from gpucloud.checkpoint import TrainingSession

        torch.manual_seed(0)
        random.seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, width), torch.nn.Dropout(0.2), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 1)
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.data = Counter()
        self.session = TrainingSession(
            self.model,
            self.optimizer,
            extra_state={"data": self.data},
            checkpoint_uri=uri,
            job_id=job_id,
            control_dir=control_dir,
            local_dir=local_dir,
            **session_kwargs,
        )

    def train_step(self) -> None:
        import random

        import torch

        g = torch.Generator().manual_seed(self.data.position)
        self.data.position += 1
        x = torch.randn(4, 8, generator=g)
        loss = self.model(x).pow(2).mean() * (1 + random.random())
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def run(self, until: int) -> int:
        start = self.session.restore()
        for step in range(start, until):
            self.train_step()
            self.session.step_done(step + 1)
        self.session.finish()
        return start

    def weights(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
