"""Methods injected into every vLLM worker (``EngineArgs(worker_extension_cls=WORKER_EXTENSION)``).

vLLM mixes this class into its worker class, so ``self`` below is the worker (CPU or GPU) and each
method is callable from the engine with ``engine.collective_rpc("method", args=(...))``. The engine
runs its worker in another process and msgpacks RPC arguments, so everything that crosses is a plain
value: a file path, a shared-memory name, names, dtypes as strings, shapes as lists. Tensors never go
through the RPC (vLLM decodes utility-call arguments without types, so a tensor would arrive as a
list).

The weights arrive as a file path (``update_weights_from_file``) or as the name of a shared-memory
segment the generator assembled the safetensors image in (``update_weights_from_shm``), which the
worker maps and views in place: the image is never written out or copied through the RPC.

Three facts about vLLM 0.32 shape the loading code:

- ``model.load_weights()`` alone is wrong on the CPU backend: after start-up each linear weight is
  repacked for oneDNN/sgl kernels and the ``.weight`` parameter is emptied. The worker's
  ``reload_weights(weights_iterator=..., is_checkpoint_format=True)`` restores the layers, loads the
  checkpoint-format tensors and re-runs the per-layer post-processing (the repacking) correctly.
- With tied embeddings the LM head shares ``embed_tokens.weight`` but keeps its own packed copy for
  the logits GEMM, made at start-up; nothing re-packs it on reload, so it would keep the old
  weights. ``_repack_tied_lm_head`` redoes it.
- The worker does not invalidate the engine's prefix cache; the caller (``RolloutEngine``) does.

On GPUs with ``weights.method = "nccl"`` the tensors arrive by broadcast from the learner
(``stream_dapo.weights.nccl.NcclWeightReceiver``) straight into the worker that owns the GPU; they
go through the same reload.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["WORKER_EXTENSION", "WeightUpdateExtension"]

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "stream_dapo.generator.worker_ext.WeightUpdateExtension"
"""The qualified name to pass as ``worker_extension_cls``."""

_EMBED_NAME = "model.embed_tokens.weight"


class WeightUpdateExtension:
    """Weight loading entry points for the generator (mixed into vLLM's worker class).

    Attribute names are prefixed ``sd_`` where they could collide with the worker's own: vLLM
    refuses an extension whose attributes shadow the worker's.
    """

    # ---------------------------------------------------------------- file / bytes (CPU default)

    def update_weights_from_file(self, path: str) -> bool:
        """Load a full safetensors state dict (checkpoint names) into the running model.

        Returns True once the weights are in place and the spot check passed; raises with the
        reason otherwise (the caller keeps sampling from the old weights only if this raises before
        the reload started, so it treats any error as fatal for the engine).
        """
        from safetensors import safe_open

        start = time.perf_counter()
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
            if not names:
                raise ValueError(f"{path} holds no tensors; the learner published an empty state dict")

            def tensors() -> Iterator[tuple[str, torch.Tensor]]:
                for name in names:
                    yield name, f.get_tensor(name)

            self._sd_reload(tensors())
            expected = f.get_tensor(_EMBED_NAME) if _EMBED_NAME in names else None
        self._sd_verify_embedding(expected, path)
        logger.info("loaded %d tensors from %s in %.2f s", len(names), path, time.perf_counter() - start)
        return True

    def update_weights_from_shm(self, name: str, nbytes: int) -> bool:
        """Load a full safetensors image that the generator assembled in shared memory ``name``.

        The tensors are views into the mapped pages (``stream_dapo.weights.safetensors_view``):
        nothing is written to disk, read back or copied before the reload copies each tensor into
        its parameter. Returns True, or raises, as ``update_weights_from_file``.
        """
        import torch

        from stream_dapo.weights.image import map_image
        from stream_dapo.weights.safetensors_view import tensors_from_buffer

        start = time.perf_counter()
        with map_image(name, nbytes) as view:
            tensors = tensors_from_buffer(torch.frombuffer(view, dtype=torch.uint8))
            count = len(tensors)
            self._sd_reload(iter(tensors))
            expected = next((t for n, t in tensors if n == _EMBED_NAME), None)
            self._sd_verify_embedding(expected, f"shared-memory image {name}")
            del tensors, expected  # views of the mapping: released before it is unmapped
        logger.info("loaded %d tensors from shared memory in %.2f s", count, time.perf_counter() - start)
        return True

    def weights_checksum(self) -> str:
        """A cheap fingerprint of the weights the worker holds (hex, 16 characters).

        Hashes a float64 sum and absolute sum of every non-empty parameter. On the CPU backend the
        repacked linear weights are empty parameters, so this covers embeddings (and through the tie,
        the LM head), norms and biases: enough to see that an update landed; the end-to-end check is
        that greedy output matches transformers on the new weights.
        """
        import torch

        digest = hashlib.sha256()
        with torch.no_grad():
            for name, param in sorted(self._sd_model().named_parameters()):
                if param.numel() == 0:
                    continue
                p = param.detach().to(torch.float64)
                digest.update(f"{name}:{p.sum().item():.12e}:{p.abs().sum().item():.12e};".encode())
        return digest.hexdigest()[:16]

    # ---------------------------------------------------------------- NCCL (GPU)

    def nccl_join(self, host: str, port: int, world_size: int, rank_base: int) -> int:
        """Join the learner's NCCL weight group (``stream_dapo.weights.nccl``); returns this worker's rank.

        Generator ``i`` passes ``rank_base = 1 + i * tensor_parallel_size``; each worker adds its rank
        inside the engine. Blocks until the learner and every other worker have joined.
        """
        from stream_dapo.weights.nccl import NcclGroupSpec, NcclWeightReceiver

        rank = rank_base + int(self.rank)  # type: ignore[attr-defined]
        spec = NcclGroupSpec(host=host, port=port, world_size=world_size)
        self.sd_nccl = NcclWeightReceiver(spec, rank, device=self.device).connect()  # type: ignore[attr-defined]
        return rank

    def nccl_receive_weights(self, timeout_s: float) -> int:
        """Take the learner's next broadcast and load it in place; returns its version."""
        import torch

        receiver = getattr(self, "sd_nccl", None)
        if receiver is None:
            raise RuntimeError("call nccl_join before nccl_receive_weights")
        version, tensors = receiver.receive(timeout_s)
        self._sd_reload(iter(tensors))
        torch.cuda.synchronize()
        return int(version)

    # ---------------------------------------------------------------- helpers

    def _sd_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined, no-any-return]

    def _sd_reload(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        self._sd_repack_tied_lm_head()

    def _sd_repack_tied_lm_head(self) -> None:
        model = self._sd_model()
        config: Any = getattr(model, "config", None)
        lm_head = getattr(model, "lm_head", None)
        if not getattr(config, "tie_word_embeddings", False) or lm_head is None:
            return
        embed = model.get_submodule("model.embed_tokens")
        if lm_head.weight is not embed.weight:
            # vLLM 0.32 keeps the tie through a reload; re-tie should a version replace the parameter.
            lm_head.weight = embed.weight
        method = getattr(lm_head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(lm_head)

    def _sd_verify_embedding(self, expected: torch.Tensor | None, path: str) -> None:
        """The embedding is never repacked, so it can be compared exactly with the file."""
        import torch

        if expected is None:
            return
        embed: torch.Tensor = self._sd_model().get_submodule("model.embed_tokens").weight  # type: ignore[assignment]
        rows = min(expected.shape[0], embed.shape[0])
        got = embed[:rows].detach().to("cpu", expected.dtype)
        if not torch.equal(got, expected[:rows]):
            raise RuntimeError(
                f"after loading {path} the embedding differs from the file: the reload did not apply"
            )
