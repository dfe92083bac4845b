"""Typed schema of a run's configuration.

Recipes are YAML files merged onto these dataclasses with OmegaConf, which already refuses unknown
keys and values of the wrong type. Ranges and choices are declared next to each field
(``metadata={"min": 1}``, ``{"choices": (...)}``) and checked by one generic walker in
:mod:`rlweave.config.load`, instead of a hand-written validator per section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def positive(default: int) -> Any:
    return field(default=default, metadata={"min": 1})


def non_negative(default: float) -> Any:
    return field(default=default, metadata={"min": 0})


def choice(default: str, *choices: str) -> Any:
    return field(default=default, metadata={"choices": choices})


@dataclass
class ClusterConfig:
    address: Optional[str] = None  # attach to a running Ray cluster; None = embedded Ray
    num_cpus: Optional[int] = field(default=None, metadata={"min": 1})
    num_gpus: Optional[int] = field(default=None, metadata={"min": 0})
    dashboard: bool = False
    local: bool = False  # one process, no Ray actors: breakpoint() works in worker code
    # a worker's request/reply calls to another process of its node: over a Unix socket ("direct",
    # ~10x less CPU per call) or as Ray actor calls ("ray"); calls across nodes always use Ray
    peer_calls: str = choice("direct", "direct", "ray")


@dataclass
class GroupSlotsConfig:
    slots: str = ""
    procs_per_slot: int = positive(1)
    threads: Optional[int] = field(default=None, metadata={"min": 1})  # torch threads per process


@dataclass
class PlacementConfig:
    mode: str = choice("collocated", "collocated", "disaggregated", "hybrid", "auto")
    groups: Dict[str, GroupSlotsConfig] = field(default_factory=dict)
    oversubscribe: bool = False
    derived: Dict[str, Any] = field(default_factory=dict)  # written by the run: mode and slots it used


@dataclass
class PixelsConfig:
    enabled: bool = False
    width: int = positive(64)
    height: int = positive(64)
    frame_stack: int = positive(1)
    cameras: List[str] = field(default_factory=list)  # manipulation suites: camera names, first = "image" (empty: the suite's default)


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    num_workers: int = positive(1)
    num_envs: int = positive(8)  # per worker
    chunk: int = positive(1)  # env actions per policy decision
    max_episode_steps: Optional[int] = field(default=None, metadata={"min": 1})
    normalize_reward: bool = False
    reward_clip: float = non_negative(10.0)
    on_nonfinite: str = choice("error", "error", "drop")
    pixels: PixelsConfig = field(default_factory=PixelsConfig)
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # set over kwargs for evaluation episodes only: held-out starts (e.g. metaworld's split: test)
    eval_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutConfig:
    num_workers: int = positive(1)
    micro_batches: int = positive(1)  # pipeline depth k: each env worker's envs split into k slices
    # language models (runner=llm): the generation backend and its sampling settings
    backend: str = choice("hf", "hf", "vllm")
    prompts_per_iteration: int = positive(32)  # each sampled algorithm.group_size times
    max_new_tokens: int = positive(16)
    min_new_tokens: int = non_negative(0)  # end-of-sequence suppressed before this many (benchmarks fix lengths)
    temperature: float = field(default=1.0, metadata={"min": 1e-6})
    top_p: float = field(default=1.0, metadata={"min": 1e-6, "max": 1})


@dataclass
class PlannerConfig:
    max_micro_batches: int = positive(4)  # largest pipeline depth placement.mode=auto considers
    margin: float = field(default=0.15, metadata={"min": 0})  # re-plan when |predicted-measured| > margin*measured
    verify: int = positive(3)  # shortlisted plans measured for one iteration each before choosing
    # an unmeasured shortlisted plan is verified only when predicted to beat the best measured plan
    # by this fraction of an iteration (smaller predicted gains lie within the model's error)
    min_gain: float = field(default=0.03, metadata={"min": 0, "max": 1})


@dataclass
class ActorConfig:
    num_workers: int = positive(1)
    # how several language-model actor ranks split training: ddp replicates the model and
    # all-reduces gradients once per step; fsdp shards parameters, gradients and optimizer state
    # (FSDP2); auto: ddp while the training state (16 bytes per trainable parameter) is under
    # ddp_max_gb, fsdp above. The embodied and off-policy actors always replicate.
    strategy: str = choice("auto", "auto", "ddp", "fsdp")
    ddp_max_gb: float = non_negative(2.0)
    # the attention kernel of the language-model actor's training passes (rollout engines keep
    # their own): auto = eager on CPU for sequences up to 256 tokens (scores are tiny there and
    # the fused CPU kernel's per-call cost dominates: 13% of a step measured), sdpa otherwise
    attention: str = choice("auto", "auto", "eager", "sdpa")
    # the dtype of the off-policy learner's hidden-layer matmuls (autocast): bfloat16 runs them
    # at twice the rate on CPUs with native bf16 (avx512_bf16, AMX) and on GPUs, and ~50x slower
    # than float32 where it is emulated (AVX2 CPUs); auto = bfloat16 where the learner's device
    # has it natively, else float32 (utils/precision.py). Parameters, gradients, optimizer state,
    # output layers and losses stay float32. Language models choose model.dtype instead; the
    # on-policy actors train in float32.
    precision: str = choice("float32", "float32", "bfloat16", "auto")
    # threads the off-policy learner runs one update on: 2 runs the critic's part and the actor's
    # part of an SAC or RLPD update at the same time (they read the same weights and write
    # disjoint gradients), so the learner uses a second core beside its slot; the results are
    # the same as with 1. For on-policy PPO (one actor rank, an mlp policy with a critic of its
    # own) 2 runs the value loss in a helper process while the policy loss runs: the same numbers
    # (always a process where memfd exists; update_helper below is the off-policy learner's choice)
    update_threads: int = field(default=1, metadata={"min": 1, "max": 2})
    # where the actor's part runs when update_threads=2: "process", a helper process bound to the
    # learner's parameters in shared memory (the parts do not contend for Python's GIL: an SAC
    # update took 3.8-4.1 ms against 5.1-5.3 ms on a thread, workers/update_helper.py), or
    # "thread", a thread of the learner's process. GPU learners, and systems without memfd
    # (macOS), use a thread.
    update_helper: str = choice("process", "process", "thread")


@dataclass
class PolicyConfig:
    # a name in the policy registry (built in: mlp, cnn, squashed_mlp, flow_mlp, flow_sac, recap_flow_mlp, vla; register_policy adds one),
    # checked against it when the config is loaded
    name: str = "mlp"
    hidden: List[int] = field(default_factory=lambda: [64, 64])
    activation: str = choice("tanh", "tanh", "relu")
    normalize_obs: bool = False
    log_std_init: float = 0.0
    ortho_init: bool = True
    state_dependent_std: bool = True  # squashed_mlp: log-stds from the network, or one free parameter per action dim
    # keywords of the named builder beyond the ones above (e.g. flow_mlp: steps, sampler, noise_level;
    # vla: head, image_size, ...), passed to it as they are; the builder refuses the ones it does not take
    kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RecapConfig:
    """RECAP (algorithm.name=recap, runner policy_sft): how the advantage indicator is computed."""

    # share of the dataset's rows labelled "good": the threshold is that quantile of the advantages
    positive_fraction: float = field(default=0.3, metadata={"min": 0, "max": 1})
    n_step: int = non_negative(0)  # advantage targets: 0 = Monte-Carlo returns; N = N rewards + V after N steps
    indicator_dropout: float = field(default=0.0, metadata={"min": 0, "max": 1})  # rows trained without the indicator
    value_hidden: List[int] = field(default_factory=lambda: [256, 256])
    value_updates: int = positive(2000)
    value_lr: float = field(default=1e-3, metadata={"min": 0})
    value_folds: int = positive(5)  # cross-fitting by episode; 1 = one value fitted on every episode


@dataclass
class AlgorithmConfig:
    name: str = "ppo"
    # modules that register estimators, losses, algorithms or policies, imported by the driver and by
    # every worker process before their lookups (registrations live in the process that made them)
    plugins: List[str] = field(default_factory=list)
    gamma: float = field(default=0.99, metadata={"min": 0, "max": 1})
    gae_lambda: float = field(default=0.95, metadata={"min": 0, "max": 1})
    clip_eps: float = field(default=0.2, metadata={"min": 0})
    clip_eps_high: Optional[float] = field(default=None, metadata={"min": 0})
    dual_clip: Optional[float] = field(default=None, metadata={"min": 1})
    value_clip: Optional[float] = field(default=None, metadata={"min": 0})
    vf_coef: float = non_negative(0.5)
    ent_coef: float = non_negative(0.0)
    epochs: int = positive(10)
    minibatch_size: int = positive(64)
    # rows per forward/backward within a minibatch (gradient accumulation: the same update with a
    # fraction of the activation memory, for large policies such as VLAs, and for language-model
    # updates and SFT steps over long rows); None = the whole minibatch
    micro_batch_size: Optional[int] = field(default=None, metadata={"min": 1})
    # on-policy with a critic (PPO): the first N iterations train the critic's own parameters only
    # (the value loss; the policy's weights, shared layers included, stay exactly as they started), so a value
    # head new to a pretrained policy (a VLA after SFT) is fitted before its advantages move the policy
    critic_warmup_iterations: int = field(default=0, metadata={"min": 0})
    # on-policy (embodied actor): the iteration's epochs stop early once an epoch's mean approx_kl
    # exceeds 1.5 x this (SB3's rule); None = every epoch. For policies whose log-probs move fast
    # per step, such as a flow policy's denoising chain
    target_kl: Optional[float] = field(default=None, metadata={"min": 0})
    lr: float = field(default=3e-4, metadata={"min": 0})
    lr_anneal: bool = False
    clip_anneal: bool = False
    max_grad_norm: float = non_negative(0.5)
    norm_adv: bool = True
    group_size: int = positive(8)  # GRPO: episodes that share a reset seed
    # off-policy (SAC, CrossQ, ...)
    batch_size: int = positive(256)
    utd_ratio: float = field(default=1.0, metadata={"min": 0})  # gradient updates per env step
    learning_starts: int = non_negative(100)  # env steps before learning (uniform random actions, unless the policy starts from init.*)
    tau: float = field(default=0.005, metadata={"min": 0, "max": 1})  # Polyak rate of the target critic
    policy_delay: int = positive(1)  # actor (and temperature) updated every k critic updates
    n_step: int = positive(1)
    alpha_init: float = field(default=1.0, metadata={"min": 1e-8})
    autotune_alpha: bool = True
    target_entropy: Optional[float] = None  # default: -action_dim
    actor_lr: Optional[float] = field(default=None, metadata={"min": 0})  # default: lr
    critic_lr: Optional[float] = field(default=None, metadata={"min": 0})
    alpha_lr: Optional[float] = field(default=None, metadata={"min": 0})
    adam_betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    # the actor's learning rate: constant, or cosine-decayed to 0 over the run's gradient updates
    # (IQL's reference setting: the policy extracted at the end is not a mid-step snapshot)
    actor_lr_schedule: str = choice("constant", "constant", "cosine")
    # SAC's actor: + bc_coef * mean squared distance of its action to the batch's (offline-to-online
    # from demonstrations, as SAC Flow's: the actor stays near the data while the critics learn); 0 = off
    bc_coef: float = non_negative(0.0)
    # language models (runner=llm)
    kl_coef: float = non_negative(0.0)  # towards the reference (initial) model; 0 = no reference model
    kl_estimator: str = choice("k3", "k1", "k2", "k3")
    kl_mode: str = choice("loss", "loss", "reward")  # a KL loss term (GRPO) or a per-token reward penalty (PPO, REINFORCE++)
    loss_agg: str = choice("token_mean", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
    dynamic_sampling: bool = False  # DAPO: drop groups whose responses all scored the same, sample more prompts
    max_sampling_rounds: int = positive(4)  # dynamic sampling: generation rounds per iteration at most
    overlong_buffer: int = non_negative(0)  # DAPO: the last this many of rollout.max_new_tokens are penalised; 0 = off
    overlong_penalty: float = non_negative(1.0)
    is_cap: float = field(default=2.0, metadata={"min": 1e-6})  # async PPO: truncation of the importance weights
    # IQL: expectile of the value regression, inverse temperature (beta) of the advantage weights
    # and their clip
    expectile: float = field(default=0.7, metadata={"min": 0.5, "max": 1})
    temperature: float = non_negative(3.0)
    max_weight: float = field(default=100.0, metadata={"min": 1})
    recap: RecapConfig = field(default_factory=RecapConfig)


@dataclass
class CriticConfig:
    """Off-policy critics: an ensemble of Q-networks."""

    hidden: List[int] = field(default_factory=lambda: [256, 256])
    num_q: int = positive(2)
    activation: str = choice("relu", "relu", "tanh")
    norm: str = choice("none", "none", "layer", "batch")  # LayerNorm (RLPD) or BatchNorm (CrossQ)
    bn_momentum: float = field(default=0.01, metadata={"min": 0, "max": 1})


@dataclass
class ReplayConfig:
    capacity: int = positive(1_000_000)  # transitions per source
    offline_dataset: Optional[str] = None  # a Minari dataset folder (rlweave collect), replayed beside online data
    offline_share: float = field(default=0.5, metadata={"min": 0, "max": 1})  # of each batch (RLPD: 0.5)
    # scale the dataset's rewards by 1000 / (max - min episode return): IQL's locomotion setting,
    # so its advantage temperature means the same on every dataset
    offline_reward_scale: str = choice("none", "none", "return_range")


@dataclass
class ImitationConfig:
    """BC / DAgger / HG-DAgger: who labels, who acts."""

    expert: Optional[str] = None  # a run folder (its latest checkpoint) or module:function
    beta: float = field(default=1.0, metadata={"min": 0, "max": 1})  # DAgger: P(expert acts) in the first iteration
    beta_decay: float = field(default=0.0, metadata={"min": 0, "max": 1})  # per iteration: beta_i = beta * decay**i
    gate: str = choice("action_gap", "action_gap", "operator", "none")  # HG-DAgger: who decides to intervene
    gate_threshold: float = non_negative(0.5)  # action_gap: take over when |learner - expert| > this
    operator: Optional[str] = None  # gate=operator: name of the operator process's Ray actor


@dataclass
class ModelConfig:
    """A causal language model (runner=llm): a local Hugging Face folder, or an architecture built
    from these fields with random weights (nothing is downloaded)."""

    path: Optional[str] = None  # a local folder with config.json and weights (from_pretrained)
    arch: str = choice("qwen3", "qwen2", "qwen3", "llama")
    hidden_size: int = positive(128)
    num_layers: int = positive(4)
    num_heads: int = positive(4)
    num_kv_heads: int = positive(2)
    intermediate_size: int = positive(256)
    max_positions: int = positive(128)
    tokenizer: Optional[str] = None  # a local tokenizer folder; default: path's, else one trained on the task's text
    vocab_size: int = positive(320)  # of a tokenizer trained here
    dtype: str = choice("float32", "float32", "bfloat16")
    # the forward pass of training and HF-backend generation: auto = rlweave's fused forward
    # (models/fused_decoder.py) for Qwen2/Qwen3/Llama models on CPU that it covers, the
    # transformers forward otherwise; hf = always the transformers forward
    kernels: str = choice("auto", "auto", "hf")
    lora_rank: int = non_negative(0)  # 0 = full fine-tuning; > 0: LoRA adapters (peft) only
    lora_alpha: int = positive(16)


@dataclass
class TaskConfig:
    """Prompts with verifiable answers (runner=llm)."""

    # a name in the task registry (built in: arithmetic, jsonl_qa, calc, multihop; register_task adds one),
    # checked by building the task when the config is loaded
    name: str = "arithmetic"
    ops: Optional[List[str]] = None  # arithmetic, calc; None = the task's default (+ and *)
    min_digits: Optional[int] = field(default=None, metadata={"min": 1})  # None = the task's default (arithmetic 1-2, calc 4-5)
    max_digits: Optional[int] = field(default=None, metadata={"min": 1})
    corpus: Optional[str] = None  # multihop: folder of the generated corpus (made there on first use)
    hops: List[int] = field(default_factory=lambda: [1, 2])  # multihop: question hop counts drawn (1, 2, 3)
    entities: int = positive(300)  # multihop: people in a newly made corpus (companies and cities in proportion)
    corpus_seed: int = 0  # multihop: seed of a newly made corpus (independent of the run's seed)
    test_fraction: float = field(default=0.1, metadata={"min": 0, "max": 1})
    search_k: int = positive(3)  # multihop: passages a search returns by default (each ~50 tokens of the episode)
    train_file: Optional[str] = None  # jsonl_qa: {question, answer} per line
    test_file: Optional[str] = None
    question_key: str = "question"
    answer_key: str = "answer"
    template: Optional[str] = None  # prompt text; {a} {op} {b} (arithmetic) or {question} (jsonl_qa)
    reward_fn: Optional[str] = None  # module:function (prompt, response) -> float; default: the answer checker
    reward_timeout_s: float = field(default=10.0, metadata={"min": 1e-3})
    reward_on_error: str = choice("zero", "zero", "raise")
    max_prompt_tokens: int = positive(256)
    prompt_overflow: str = choice("drop", "drop", "truncate")  # prompts longer than max_prompt_tokens
    eval_prompts: int = positive(200)  # held-out prompts per evaluation (greedy)
    # a prompt meta key (multihop: kind): train prompts are drawn per value of it, in proportion to its
    # recent training failure rate (at least curriculum_floor), so a kind the policy forgot gets groups again
    curriculum: Optional[str] = None
    curriculum_floor: float = field(default=0.05, metadata={"min": 0, "max": 1})


@dataclass
class DataConfig:
    """Supervised fine-tuning data (algorithm.name=sft)."""

    path: Optional[str] = None  # JSONL of {prompt, response} or {messages: [{role, content}, ...]}; None = the task's train split with gold answers
    prompt_key: str = "prompt"
    response_key: str = "response"
    packing: bool = False  # several examples per row (no padding) instead of one padded example per row
    max_tokens: int = positive(256)  # per example (and per packed row)
    # which tokens the loss covers: responses (assistant turns; prompts and tool observations masked) or all
    # (language modelling on the whole text: what a model built from a config lacks and a pretrained one has,
    # e.g. copying a name it has read; the same choice as TRL's assistant_only_loss / completion_only_loss)
    loss_on: str = choice("responses", "responses", "all")


@dataclass
class AgentConfig:
    """Multi-turn tool use (runner=llm): with ``tools`` set, every rollout and evaluation is an
    episode of model turns and tool observations (rlweave/agents/loop.py)."""

    # make_toolbox entries: "calculator", {name: search, ...}, {mcp: {command: [...]}}, or "task" (the task's own tools); empty = single-turn
    tools: List[Any] = field(default_factory=list)
    # how episodes are produced (rlweave/agents/workflows.py): tools (the built-in loop), openai (openai_fn),
    # solver_verifier (two roles of one policy); unset: openai with openai_fn, else tools with tools
    workflow: Optional[str] = None
    role_weights: Dict[str, float] = field(default_factory=dict)  # role -> scale of its rows' advantages (default 1)
    # user agent code over the OpenAI API instead of the built-in loop (rlweave/agents/openai_rollout.py):
    # module:function or file.py:function taking (openai.OpenAI client, Prompt), returning the final answer;
    # the rollout worker's engine serves it at /v1/chat/completions (openai_host:openai_port, loopback by default)
    openai_fn: Optional[str] = None
    episode_timeout_s: float = field(default=120.0, metadata={"min": 1e-3})  # openai_fn: an episode's wall time
    max_concurrency: int = positive(64)  # openai_fn: episodes run at once (threads), and the largest generation batch
    openai_host: str = "127.0.0.1"
    openai_port: int = non_negative(0)  # 0: a free port
    max_turns: int = positive(4)  # model turns per episode
    max_tokens: int = positive(256)  # response tokens per episode (model turns and observations); rollout.max_new_tokens bounds one turn
    tool_timeout_s: float = field(default=10.0, metadata={"min": 1e-3})  # per call, for entries that set no timeout_s
    # SFT on an agent task without data.path: this many expert traces (the task's scripted expert with
    # the real tools) are written to RUN/traces.jsonl and trained on
    sft_traces: int = positive(1000)


@dataclass
class InitConfig:
    """Where a run's weights start: a language model's, or an embodied policy's (on- and off-policy runners)."""

    checkpoint: Optional[str] = None  # a run folder (its newest checkpoint's model) or a Hugging Face model folder
    # when checkpoint is not given: run this recipe first, into the run's sft/ folder, and start from its result
    sft_recipe: Optional[str] = None
    sft_overrides: List[str] = field(default_factory=list)
    # a policy that starts from another run's weights keeps the observation statistics it was trained
    # with ("keep"): folding the RL run's observations in changes the function it computes (a BC
    # policy fitted on 3 demonstrations fell from 0.17 to 0 success within two PPO iterations);
    # "update" lets them move as in a run from scratch
    obs_stats: str = choice("keep", "keep", "update")


@dataclass
class TrainConfig:
    total_env_steps: int = positive(100_000)
    rollout_steps: int = positive(128)  # policy decisions per env per iteration (max episode steps for GRPO)
    eval_every: int = non_negative(10)  # iterations; 0 = never
    eval_episodes: int = positive(10)
    # of each evaluation's episodes, how many to record as videos (camera images, instruction,
    # outcome) under RUN/videos/; 0 = none. Envs without images record nothing
    eval_videos: int = non_negative(0)
    # at most this many evaluation envs at once (the episodes run in batches, each with the seed and
    # task it has when all run at once); null = all at once. A LIBERO env holds ~1 GB
    eval_max_envs: Optional[int] = field(default=None, metadata={"min": 1})
    checkpoint_every: int = non_negative(25)  # iterations; 0 = only at the end
    # off-policy: the learner trains while env workers collect. A transition may reach the learner
    # at most max_staleness policy versions after the one that acted (0 = collect, then train);
    # rollout weights are refreshed every sync_every iterations.
    max_staleness: int = non_negative(1)
    sync_every: int = positive(1)
    keep_checkpoints: int = positive(3)
    keep_best: bool = False  # also keep the checkpoint with the best evaluation return
    # a worker process that dies (killed, segfault, out of memory) costs a rebuild of the worker
    # groups and the work since the newest checkpoint, at most this many times per run
    max_restarts: int = non_negative(3)
    # offline algorithms (IQL, offline BC) take no env steps: they run total_updates gradient
    # updates, updates_per_iteration per iteration (eval_every and checkpoint_every count these)
    total_updates: int = non_negative(0)
    updates_per_iteration: int = positive(1000)
    # language-model RL (runner=llm): the run's length in iterations (one generation + update each)
    total_iterations: int = non_negative(0)
    # end the run early once an evaluation reaches this (eval/episode_return, or eval/accuracy for
    # language models): e.g. an SFT warm-up that stops at a given held-out accuracy
    stop_at_eval: Optional[float] = None
    # language-model SFT with stop_at_eval: once an evaluation is within half of the target,
    # iterations of this many updates, each evaluated, so the run stops close to the target
    stop_approach_updates: int = positive(5)


@dataclass
class RunConfig:
    dir: Optional[str] = None
    progress: bool = True
    # experiment trackers every metrics.jsonl record goes to, at one step (env_steps; the iteration
    # for language-model and offline runs): tensorboard, wandb, mlflow (rlweave[wandb], rlweave[mlflow]).
    # Checked before start; one that cannot start or fails is dropped with a warning, never the run
    loggers: List[str] = field(default_factory=lambda: ["tensorboard"])
    tensorboard: bool = True  # false: no TensorBoard even when run.loggers names it (the older switch)
    project: Optional[str] = None  # W&B project / MLflow experiment; default: WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME, else rlweave
    name: Optional[str] = None  # the tracker run's name; default: the run folder's name
    group: Optional[str] = None  # W&B group (MLflow tag "group"); default: the recipe
    tags: List[str] = field(default_factory=list)
    # deterministic kernels in every process, and no timing-driven layout changes, so that a run
    # stopped and resumed (or restarted after a failure) logs the same values as one that was not
    deterministic: bool = False
    trace_iterations: int = non_negative(3)  # iterations whose per-micro-batch events go to trace.json


@dataclass
class Config:
    recipe: str = ""
    description: str = ""
    seed: int = non_negative(0)
    runner: str = choice("onpolicy", "onpolicy", "offpolicy", "llm", "policy_sft")
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    imitation: ImitationConfig = field(default_factory=ImitationConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    init: InitConfig = field(default_factory=InitConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
