"""Liger-Kernel's own unit tests, adapted to call tessera (dev tool): a pytest plugin that, before
any test module imports them, replaces liger_kernel.chunked_loss's loss modules, autograd
Functions and functional forms with tessera.post_training's, each Function's positional arguments
passed by Liger's names (its forward's signature). An option tessera lacks fails its test with
tessera's TypeError naming it; nothing is skipped here.

    PYTHONPATH=<liger_kernel>:<a Liger checkout's root>:dev python -m pytest -p liger_adapt \
        <the checkout>/test/chunked_loss

Liger's tests are not part of this repository: take them from a checkout of Liger-Kernel.
"""
import inspect

import liger_kernel.chunked_loss as chunked
import liger_kernel.chunked_loss.functional as functional

import tessera.post_training as tp

# Liger's module -> (its loss class, its Function, its functional form, tessera's function)
LOSSES = {
    "dpo_loss": ("LigerFusedLinearDPOLoss", "LigerFusedLinearDPOFunction", "liger_fused_linear_dpo", tp.dpo_loss),
    "orpo_loss": ("LigerFusedLinearORPOLoss", "LigerFusedLinearORPOFunction", "liger_fused_linear_orpo",
                  tp.orpo_loss),
    "cpo_loss": ("LigerFusedLinearCPOLoss", "LigerFusedLinearCPOFunction", "liger_fused_linear_cpo", tp.cpo_loss),
    "simpo_loss": ("LigerFusedLinearSimPOLoss", "LigerFusedLinearSimPOFunction", "liger_fused_linear_simpo",
                   tp.simpo_loss),
    "kto_loss": ("LigerFusedLinearKTOLoss", "LigerFusedLinearKTOFunction", "liger_fused_linear_kto", tp.kto_loss),
    "grpo_loss": ("LigerFusedLinearGRPOLoss", "LigerFusedLinearGRPOFunction", "liger_fused_linear_grpo",
                  tp.grpo_loss),
    "jsd_loss": ("LigerFusedLinearJSDLoss", "LigerFusedLinearJSDFunction", "liger_fused_linear_jsd", tp.jsd_loss),
    "cosine_similarity_loss": ("LigerFusedLinearCosineSimilarityLoss", "LigerFusedLinearCosineSimilarityFunction",
                               "liger_fused_linear_cosine", tp.cosine_similarity_loss),
}
LIGER_ONLY = {"compiled", "chunk_size"}  # how Liger runs, not what it computes
RENAMED = {"_input": "hidden"}  # the preference losses' hidden states


def _adapter(names, ours):
    """A stand-in for a Liger Function's apply: its arguments by Liger's names, as tessera's
    function takes them."""
    takes = inspect.signature(ours).parameters

    def apply(*args, **kwargs):
        given = {**dict(zip(names, args)), **kwargs}
        call = {}
        for name, value in given.items():
            if name in LIGER_ONLY and name not in takes:
                continue
            call[RENAMED.get(name, name) if name not in takes else name] = value
        return ours(**call)
    return apply


def pytest_configure(config):
    import importlib
    for module_name, (loss, function, functional_name, ours) in LOSSES.items():
        module = importlib.import_module(f"liger_kernel.chunked_loss.{module_name}")
        names = list(inspect.signature(getattr(module, function).forward).parameters)[1:]  # without ctx
        apply = _adapter(names, ours)
        stand_in = type(function, (), {"apply": staticmethod(apply)})
        setattr(module, function, stand_in)
        setattr(functional, functional_name, apply)
        ours_cls = getattr(tp, loss.removeprefix("Liger"))
        setattr(chunked, loss, ours_cls)
        setattr(module, loss, ours_cls)
