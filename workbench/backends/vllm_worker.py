"""Methods mixed into vLLM's worker processes (``worker_extension_cls``), reached by name through RPC.

``VLLMBackend`` starts its engine with ``WorkbenchWorkerExtension``; the backend then calls
``engine.collective_rpc("workbench_reload_weights", ...)``. Plain method names travel over vLLM's
safe serialisation, where shipping a function would need ``VLLM_ALLOW_INSECURE_SERIALIZATION``.
This module runs inside vLLM's worker: it imports nothing from the workbench.
"""

from __future__ import annotations


class WorkbenchWorkerExtension:
    """Weight updates for a running engine (``self`` is vLLM's worker)."""

    def workbench_reload_weights(self, weights_path: str) -> bool:
        """Reload the model's weights in place from a checkpoint directory; True if a tied head was re-packed."""
        self.reload_weights(weights_path=weights_path)
        return self.workbench_repack_tied_lm_head()

    def workbench_repack_tied_lm_head(self) -> bool:
        """Re-pack a tied output layer on CPU after an in-place reload.

        vLLM's CPU build packs each linear weight into a private copy for its GEMM kernels, the output
        layer included. With tied embeddings a checkpoint has no ``lm_head`` weight, so an in-place
        reload updates the embedding but leaves the output layer's packed copy stale (seen with vLLM
        0.31.0 on ``tiny``: generations then mixed new embeddings with the old output layer). GPU
        builds read the shared weight directly and need nothing.
        """
        from vllm.platforms import current_platform

        model = self.model_runner.get_model()
        config = self.model_runner.model_config.hf_config.get_text_config()
        head = getattr(model, "lm_head", None)
        if not current_platform.is_cpu() or head is None or not getattr(config, "tie_word_embeddings", False):
            return False
        head.quant_method.process_weights_after_loading(head)
        return True
