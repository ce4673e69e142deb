"""The ``model:`` config section (``ModelConfig``): imports no TensorFlow, so reading a config stays cheap."""

from __future__ import annotations

import dataclasses
from typing import Literal

from hvdtrack.configtools import check

# The non-linearities ``model.activation`` may name (``mlp.ACTIVATIONS`` holds the ops).
ACTIVATION_NAMES = ("relu", "tanh", "elu")

# Compute dtypes of ``model.precision`` (variables, gradients and optimizer stay float32).
PRECISIONS = ("float32", "bfloat16", "float16")

# Upper bounds, far above real use (the studies: widths 128, 2 layers, 8 steps), so that a typo
# (an extra zero or three) is refused by name rather than found by the out-of-memory killer.
MAX_LAYER_WIDTH = 16384
MAX_LAYERS = 64
MAX_MESSAGE_PASSING_STEPS = 128
MAX_EDGE_RUNS = 64


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The ``model:`` config section: layer sizes of the segment classifier.

    Attributes:
      node_encoder: MLP sizes applied to the input node features; the last is the node latent size.
      edge_encoder: MLP sizes applied to the input edge features; the last is the edge latent size.
      edge_update: core edge MLP sizes; the last must equal ``edge_encoder[-1]`` (the latent is
        concatenated with the encoded edges at every step).
      node_update: core node MLP sizes; the last must equal ``node_encoder[-1]``.
      num_message_passing_steps: times the shared core is applied.
      layer_norm: add a LayerNorm after the encoder and core MLPs.
      output_every_step: return the edge logits after every step (the loss averages them), or
        only after the last.
      output_head: hidden sizes of the edge output MLP; a final 1-unit linear layer is added.
      activation: non-linearity of every MLP.
      factorized_edge_update: compute the edge update's first layer part by part instead of on
        the concatenated [E, 2 L_e + 4 L_n] input: the node parts on the N nodes before the
        gather ((x @ W_r)[receivers] rather than x[receivers] @ W_r) and the encoded parts once
        per forward pass rather than once per step. Same function, same variables (names and
        shapes), fewer FLOPs and no [E, 384] concatenation; see ``hvdtrack.bench.model``.
      recompute: keep only the step boundaries for the backward pass (each message-passing
        step's node and edge latents, the encoded latents and the gather indices) and compute
        everything else again there, edges in chunks of ``chunk_edges`` (``model.recompute``):
        the same gradients, the memory of the boundaries plus two chunks, for about one more
        forward pass.
      chunk_edges: with ``recompute``, rows per chunk of the recomputed MLPs (edges, and the
        nodes' too; forward and backward): the working memory of a step beyond its boundaries.
        0 (the default): by the process's intra-op threads, 2048 rows on one thread (a
        chunk's tensors stay in cache), 16384 on more (``chunks.auto_chunk_edges``).
      boundary_every: with ``recompute``, keep the boundaries of every this many steps
        (1: every step's); the backward pass computes the boundaries in between again (one
        more edge pass per step that was not kept) for about 1/boundary_every of their memory.
      keep_edge_term: with ``recompute`` and ``factorized_edge_update``, keep the edge term
        every step shares (``e_enc @ W_e_enc + b``, [E, H]) and sum its gradient over the
        steps, instead of computing it and its gradient again per step and chunk ("speed
        first"): 2 H floats more per edge (1 KiB in float32 at H = 128) for a recomputed step
        at 1.27-1.33x the plain one instead of 1.48x (one thread, 160k edges; docs/performance.md,
        "The shared edge term kept"). Where the edge update ends in the fused layer norm
        (float32, ReLU, CPU kernels), the backward pass also reads each step's norm output (the
        next step's input edges, kept anyway), its row statistics and the forward pass's sums per
        node instead of computing them again (docs/performance.md, "The edge updates' norm
        outputs kept"). Speed first also keeps TensorFlow's caching allocator (``memory_first``
        is false), whose reused blocks make the recomputed step 1.21-1.31x the plain one on one
        thread, against 1.36-1.54x with the system allocator (docs/performance.md, "The
        recomputed step's allocator"). "auto" (the default): kept when the step with it fits
        the memory a process has for its largest graph, by ``cost.recomputed_step_bytes``
        (``cost.resolve_keep_edge_term``: training resolves it from its dataset's largest
        graph and its rank's share of the machine's memory, ``bench model`` from its sizes and
        ``--memory-budget``): speed first where the memory allows it, memory first beyond.
      offload: with ``recompute``, keep the step boundaries in host memory between the forward
        and the backward pass (a GPU's memory then holds one step); on a CPU host memory is
        where they are, and this changes nothing.
      edge_runs: the plain forward pass (without ``recompute``) cuts the edges into this many
        runs of consecutive edges and runs each step's edge update and head on each run as its
        own chain of ops; only the node update joins them. With two inter-op threads two
        chains' ops run at once, where one op alone gains little from a second core when it is
        a pass over memory (docs/performance.md, "The edges in two runs"). Each run's rows are
        added onto the earlier runs' node sums in edge order, so in float32 with the kernel
        library the logits do not depend on ``edge_runs`` (runs of more than one edge:
        TensorFlow's product of a single row takes another path); the gradients do, in their
        last bits (the weight gradients are sums over the runs). Neither depends on the
        threads. The recomputed step runs its chunks two at a time instead
        (``chunks.chunk_loop``).
      precision: compute dtype of the model: "float32", "bfloat16" (CPUs with AVX512-BF16 or
        AMX, and GPUs) or "float16" (GPUs; the trainer scales the loss). Variables, gradients,
        optimizer and the returned logits stay float32; layer norm statistics are float32.

    Bounds: at most ``MAX_LAYERS`` (64) sizes per MLP, each at most ``MAX_LAYER_WIDTH``
    (16384), at most ``MAX_MESSAGE_PASSING_STEPS`` (128) steps and ``MAX_EDGE_RUNS`` (64)
    runs of edges. ``hvdtrack train`` also
    refuses a model whose weights and optimizer state do not fit the machine's memory
    (``hvdtrack.distributed.launch.check_memory``).
    """

    node_encoder: tuple[int, ...] = (128, 64)
    edge_encoder: tuple[int, ...] = (128, 64)
    edge_update: tuple[int, ...] = (128, 64)
    node_update: tuple[int, ...] = (128, 64)
    num_message_passing_steps: int = 8
    layer_norm: bool = False
    output_every_step: bool = True
    output_head: tuple[int, ...] = (64,)
    activation: Literal["relu", "tanh", "elu"] = "relu"
    factorized_edge_update: bool = False
    recompute: bool = False
    chunk_edges: int = 0
    boundary_every: int = 1
    keep_edge_term: bool | Literal["auto"] = "auto"
    offload: bool = False
    edge_runs: int = 2
    precision: Literal["float32", "bfloat16", "float16"] = "float32"

    def __post_init__(self) -> None:
        for key in ("node_encoder", "edge_encoder", "edge_update", "node_update", "output_head"):
            sizes = getattr(self, key)
            check(isinstance(sizes, (tuple, list)), key, f"must be a list of sizes, got {sizes!r}")
            object.__setattr__(self, key, tuple(sizes))
            check(
                all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes),
                key,
                f"sizes must be integers > 0, got {list(sizes)}",
            )
            check(key == "output_head" or len(sizes) > 0, key, "must list at least one layer size")
            check(
                len(sizes) <= MAX_LAYERS and max(sizes, default=0) <= MAX_LAYER_WIDTH,
                key,
                f"must list at most {MAX_LAYERS} sizes of at most {MAX_LAYER_WIDTH} each, "
                f"got {_short(sizes)}",
            )
        check(
            self.edge_update[-1] == self.edge_encoder[-1],
            "edge_update",
            f"last size ({self.edge_update[-1]}) must equal the edge latent size "
            f"edge_encoder[-1] ({self.edge_encoder[-1]})",
        )
        check(
            self.node_update[-1] == self.node_encoder[-1],
            "node_update",
            f"last size ({self.node_update[-1]}) must equal the node latent size "
            f"node_encoder[-1] ({self.node_encoder[-1]})",
        )
        steps = self.num_message_passing_steps
        check(
            isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1,
            "num_message_passing_steps",
            f"must be an integer >= 1, got {steps!r}",
        )
        check(
            steps <= MAX_MESSAGE_PASSING_STEPS,
            "num_message_passing_steps",
            f"must be at most {MAX_MESSAGE_PASSING_STEPS}, got {steps}",
        )
        for key in (
            "layer_norm",
            "output_every_step",
            "factorized_edge_update",
            "recompute",
            "offload",
        ):
            check(isinstance(getattr(self, key), bool), key, "must be true or false")
        chunk = self.chunk_edges
        check(
            isinstance(chunk, int) and not isinstance(chunk, bool) and 0 <= chunk <= 2**30,
            "chunk_edges",
            f"must be an integer from 0 (by the threads) to 2**30, got {chunk!r}",
        )
        every = self.boundary_every
        check(
            isinstance(every, int) and not isinstance(every, bool) and every >= 1,
            "boundary_every",
            f"must be an integer >= 1, got {every!r}",
        )
        runs = self.edge_runs
        check(
            isinstance(runs, int) and not isinstance(runs, bool) and 1 <= runs <= MAX_EDGE_RUNS,
            "edge_runs",
            f"must be an integer from 1 to {MAX_EDGE_RUNS}, got {runs!r}",
        )
        check(
            isinstance(self.keep_edge_term, bool) or self.keep_edge_term == "auto",
            "keep_edge_term",
            f"must be true, false or auto, got {self.keep_edge_term!r}",
        )
        check(
            self.recompute and self.factorized_edge_update or self.keep_edge_term is not True,
            "keep_edge_term",
            "needs model.recompute=true and model.factorized_edge_update=true",
        )
        check(
            self.recompute or not self.offload,
            "offload",
            "needs model.recompute=true (the step boundaries are what is offloaded)",
        )
        check(
            self.precision in PRECISIONS,
            "precision",
            f"must be one of {', '.join(map(repr, PRECISIONS))}, got {self.precision!r}",
        )
        check(
            self.activation in ACTIVATION_NAMES,
            "activation",
            f"must be one of {', '.join(map(repr, ACTIVATION_NAMES))}, got {self.activation!r}",
        )

    @property
    def memory_first(self) -> bool:
        """``recompute`` without ``keep_edge_term`` (false, or "auto" not resolved to true by
        ``cost.resolve_keep_edge_term``): the step gives speed for memory, and the process that
        trains it runs TensorFlow's system allocator, which returns large blocks on free,
        instead of the caching one (``hvdtrack.entry.choose_allocator``)."""
        return self.recompute and self.keep_edge_term is not True

    @property
    def node_latent_size(self) -> int:
        return self.node_encoder[-1]

    @property
    def edge_latent_size(self) -> int:
        return self.edge_encoder[-1]


def _short(sizes: tuple[int, ...]) -> str:
    """``sizes`` for a message: the list, or its length and largest size when it is long."""
    if len(sizes) <= 8:
        return str(list(sizes))
    return f"{len(sizes)} sizes up to {max(sizes)}"
