// Spec rules: every job spec key's default, allowed values and meaning,
// declared once, in kSpecRules below. ApplyDefaults fills unset fields from
// it, ValidateJobSpec checks ranges and choices against it and words its
// errors from it (so `ballast submit` and ballast-train say the same), the
// guard and the LoRA config take their defaults from it at compile time, and
// SpecTableMarkdown prints the README's "Job spec" table from it (a common
// test fails when the README's copy differs).
//
// Why one C++ table rather than custom options on the proto's fields: the
// guard (worker/train/guard/guard.h) and LoraConfig need the defaults as
// constants, which a consteval lookup in a header gives and a descriptor
// read at run time does not; and the meaning column, written for the README,
// would make job_spec.proto's options longer than its fields. The proto's
// comments say what each field is; the values live here.
//
// Thread-safe: everything here is constant.
#ifndef BALLAST_COMMON_SPEC_RULES_H_
#define BALLAST_COMMON_SPEC_RULES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace google::protobuf {
class FieldDescriptor;
}  // namespace google::protobuf

namespace ballast {

// Where an unset field's value comes from.
enum class SpecDefault {
  kNumber,    // `number`: an integer, a real or a bool (0 or 1) field
  kText,      // `text`: a string, or a list of strings joined by ", "
  kRequired,  // none: the spec must set it
  kDerived,   // decided later, from the model or the data; `shown` says how
};

// How a value is checked.
enum class SpecAllowed {
  kAny,     // any value of the field's type
  kRange,   // lo..hi, each end open or closed; 0 also passes when zero_off
  kOneOf,   // one of `choices` (each entry of a list field)
  kInCode,  // ValidateJobSpec checks it against other fields; `allowed` says how
};

struct SpecRule {
  // The YAML key, dotted (a field of a field).
  absl::string_view key;
  // Set and checked only for specs of this task; empty for every task.
  absl::string_view task = {};
  // Set and checked only for Mixture-of-Experts models: ApplyDefaults fills
  // such a key when the spec has its section (PrepareJobSpec gives one to a
  // spec whose model has experts, and refuses one whose model has none).
  bool moe_only = false;
  SpecDefault default_kind = SpecDefault::kNumber;
  double number = 0;
  absl::string_view text = {};
  // What the README shows as the default, where the value itself would not
  // fit in a table cell (a derived default, or a long prompt).
  absl::string_view shown = {};
  SpecAllowed allowed_kind = SpecAllowed::kAny;
  double lo = 0;
  double hi = 0;
  bool lo_open = false;
  bool hi_open = false;
  bool zero_off = false;  // 0 turns the feature off and is allowed too
  // For a number field without presence (a message the proto cannot change):
  // its 0, unset or written, stands for `number`, which ApplyDefaults fills.
  bool zero_default = false;
  // kOneOf: the choices, joined by ", ".
  absl::string_view choices = {};
  // kInCode: the allowed values in words, as the error and the README say them.
  absl::string_view allowed = {};
  // One line for the README.
  absl::string_view meaning = {};
};

// moe.aux_free_rate's default under balance aux_free (DeepSeek-V3's γ for
// most of its training), which its rule's `shown` says in words.
inline constexpr double kDefaultAuxFreeRate = 0.001;

// In the README's order. A default that is not zero needs a field with
// presence (`optional` in job_spec.proto), a string or a list, so that a
// user's explicit 0 is kept (spec_rules_test checks).
inline constexpr SpecRule kSpecRules[] = {
    {.key = "name",
     .default_kind = SpecDefault::kText,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "at most 128 characters, no control characters",
     .meaning = "a label for `ballast list` and the events"},
    {.key = "model.path",
     .default_kind = SpecDefault::kRequired,
     .meaning = "HF folder: `config.json` + `model.safetensors` or a sharded "
                "`model.safetensors.index.json`; `model_type` llama, qwen2, qwen3, qwen3_5 (the "
                "released vision-language checkpoints), qwen3_5_text, qwen3_moe, sdar, sdar_moe, "
                "qwen3_5_moe (the released vision-language checkpoints) or qwen3_5_moe_text"},
    {.key = "method",
     .default_kind = SpecDefault::kText,
     .text = "lora",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "lora, full",
     .meaning = "adapters on a frozen base, or a full finetune"},
    {.key = "task",
     .default_kind = SpecDefault::kText,
     .text = "causal_lm",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "causal_lm, generative_reranker, block_diffusion",
     .meaning = "what the model is trained to do: next-token cross-entropy on the supervised "
                "tokens, a reranker (see Generative reranker) or block diffusion (see Block "
                "diffusion)"},
    {.key = "lora.r",
     .number = 8,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 4096,
     .meaning = "rank (checked for every method)"},
    {.key = "lora.lora_alpha",
     .number = 16,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1e6,
     .lo_open = true,
     .meaning = "scaling = alpha / r (alpha / √r with `use_rslora`)"},
    {.key = "lora.use_rslora", .number = 0, .meaning = "rank-stabilised scaling"},
    {.key = "lora.lora_dropout",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .hi_open = true,
     .meaning = "dropout on the adapter input"},
    {.key = "lora.target_modules",
     .default_kind = SpecDefault::kText,
     .text = "q_proj, v_proj",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, in_proj_qkv, "
                "in_proj_z, in_proj_b, in_proj_a, out_proj, gate, shared_expert_gate",
     .meaning = "the linears to adapt, or the single entry `all-linear` (every one the model "
                "has but a mixture of experts' router; `in_proj_*` and `out_proj` are "
                "Qwen3.5's Gated DeltaNet layers; `gate_proj`, `up_proj` and `down_proj` "
                "adapt every expert and Qwen3.5-MoE's shared expert too, `gate` is the "
                "router and `shared_expert_gate` Qwen3.5-MoE's shared-expert gate)"},
    {.key = "lora.target_parameters",
     .default_kind = SpecDefault::kText,
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "mlp.experts.gate_up_proj, mlp.experts.down_proj, mlp.gate.weight, "
                "experts.gate_up_proj, experts.down_proj, gate.weight, gate_up_proj, down_proj",
     .meaning = "Qwen3.5-MoE's parameters that are not `nn.Linear` weights, as PEFT's "
                "`target_parameters` names them (a suffix of the parameter's name): the routed "
                "experts' fused `gate_up_proj` and `down_proj` (an A and B per expert; gate and "
                "up share A) and the router's `gate.weight`"},
    {.key = "lora.init_lora_weights",
     .default_kind = SpecDefault::kText,
     .text = "kaiming",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "kaiming, gaussian",
     .meaning = "kaiming-uniform A, or normal A with std 1/r; B = 0 either way"},
    {.key = "lora.modules_to_save",
     .default_kind = SpecDefault::kText,
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "embed_tokens, lm_head",
     .meaning = "trained in full and saved with the adapter"},
    {.key = "lora.init_adapter",
     .default_kind = SpecDefault::kText,
     .shown = "none",
     .meaning = "a PEFT adapter folder to start from (`adapter_config.json` and "
                "`adapter_model.safetensors`; same r, alpha, targets); method `lora` only"},
    {.key = "data.path",
     .default_kind = SpecDefault::kRequired,
     .meaning = "JSONL, one record per line, in `data.format`; or a `.parquet` file, a folder of "
                "parquet shards or a `datasets.save_to_disk` folder, one record per row (see "
                "Data)"},
    {.key = "data.format",
     .default_kind = SpecDefault::kDerived,
     .shown = "detected",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "messages, prompt_completion, text, tokens, reranker",
     .meaning = "the records' format, detected from the first record's keys, and logged"},
    {.key = "data.tokenizer",
     .default_kind = SpecDefault::kDerived,
     .shown = "`model.path`",
     .meaning = "a `tokenizer.json`, or a folder with one and `tokenizer_config.json`; every "
                "format but `tokens` needs it"},
    {.key = "data.columns",
     .default_kind = SpecDefault::kDerived,
     .shown = "the keys' names",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "messages, prompt, completion, text, input_ids, labels, query, positive, negative",
     .meaning = "parquet and Arrow data: the column that holds a record key, e.g. "
                "`{prompt: question, completion: answer}` (see Data)"},
    {.key = "data.template",
     .default_kind = SpecDefault::kDerived,
     .shown = "from `tokenizer_config.json`",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "qwen3, qwen3_5, chatml, llama3, none",
     .meaning = "chat template for `messages` and `prompt_completion`; `none` is plain prompt "
                "+ completion + EOS"},
    {.key = "data.train_on",
     .default_kind = SpecDefault::kText,
     .text = "assistant",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "assistant, all",
     .meaning = "the tokens the loss sees: assistant turns (the completion), or all"},
    {.key = "data.on_bad_record",
     .default_kind = SpecDefault::kText,
     .text = "fail",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "fail, skip",
     .meaning = "a record that cannot be read: fail naming file and line, or skip it and count "
                "it in the job's events"},
    {.key = "data.seq_len",
     .default_kind = SpecDefault::kRequired,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "1..max_position_embeddings of the model",
     .meaning = "tokens per row"},
    {.key = "data.truncate",
     .default_kind = SpecDefault::kText,
     .text = "error",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "error, cut, drop",
     .meaning = "a document longer than seq_len: an error (never truncated silently), cut to "
                "its first seq_len tokens, or dropped; cut and dropped ones are counted in the "
                "events"},
    {.key = "data.allow_special_tokens",
     .number = 0,
     .meaning = "a special token's text in a record's content (`<|im_start|>`) becomes that "
                "token, as transformers encodes it; off, `text` and template-less "
                "`prompt_completion` encode it as plain text and a chat holding it is a bad "
                "record. The data report counts such records either way. Not for `tokens` or "
                "`reranker`"},
    {.key = "data.packing",
     .number = 0,
     .meaning = "pack several documents into each row, best fit decreasing, with no attention "
                "and no loss across them; without it a row is one document"},
    {.key = "data.micro_batch_size",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 4096,
     .meaning = "rows per micro-batch, concatenated without padding"},
    {.key = "data.grad_accum_steps",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 65536,
     .meaning = "micro-batches per optimizer step; a multiple of `devices`"},
    {.key = "data.shuffle",
     .number = 1,
     .meaning = "a fresh permutation (from `seed`) each epoch, of the documents and, packed, "
                "of the rows"},
    {.key = "eval.path",
     .default_kind = SpecDefault::kText,
     .shown = "none",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "records in `data.path`'s format; tasks causal_lm, block_diffusion",
     .meaning = "a validation set: its loss, as training defines it, before step 1, every "
                "`eval.every` steps and at the end (see Validation)"},
    {.key = "eval.fraction",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .lo_open = true,
     .hi_open = true,
     .zero_off = true,
     .meaning = "or: this share of `data.path`'s documents, drawn from `eval.seed` and held out "
                "of training; one of `eval.path` and `eval.fraction`"},
    {.key = "eval.every",
     .number = 0,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "0..max_steps",
     .meaning = "steps between evaluations; 0 evaluates before step 1 and at the end only"},
    {.key = "eval.max_tokens",
     .number = 0,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "0, or at least `data.seq_len`",
     .meaning = "the most tokens one evaluation reads, its rows in file order; 0 reads them all"},
    {.key = "eval.seed",
     .default_kind = SpecDefault::kDerived,
     .shown = "`seed`",
     .meaning = "`eval.fraction`'s split, and block diffusion's noise draw on the validation "
                "set, the same at every evaluation"},
    {.key = "early_stopping.metric",
     .default_kind = SpecDefault::kText,
     .shown = "`eval_loss`",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "eval_loss (needs `eval`); mrr_at_10, ndcg_at_10 (a reranker's, needs "
                "`reranker.eval_path`)",
     .meaning = "stop when this evaluation stops improving, and export the best one's "
                "checkpoint (see Validation and early stopping)"},
    {.key = "early_stopping.patience",
     .default_kind = SpecDefault::kRequired,
     .shown = "required with `early_stopping`",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "1..10^6",
     .meaning = "evaluations in a row without an improvement before the job stops"},
    {.key = "early_stopping.min_delta",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1e6,
     .meaning = "an improvement beats the best by more than this, in the metric's units"},
    {.key = "early_stopping.warmup_evals",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1e6,
     .meaning = "the first evaluations after step 0, which neither count against patience nor "
                "can be the best"},
    {.key = "export",
     .default_kind = SpecDefault::kText,
     .shown = "`last`; `best` with `early_stopping`",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "last, best (needs `eval`)",
     .meaning = "the weights exported: the last step's, or the best `eval_loss`'s checkpoint"},
    {.key = "reranker.loss",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .text = "listwise",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "listwise, pointwise",
     .meaning = "`listwise`: cross-entropy over a group's scores / temperature, the positive the "
                "target; `pointwise`: BCE on Δ"},
    {.key = "reranker.score",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .text = "logit_diff",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "logit_diff, logsigmoid",
     .meaning = "the listwise score, Δ or log σ(Δ)"},
    {.key = "reranker.temperature",
     .task = "generative_reranker",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1e-6,
     .hi = 100,
     .meaning = "τ of the listwise loss"},
    {.key = "reranker.instruction",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .text = "Given a web search query, retrieve relevant passages that answer the query",
     .shown = "Qwen3-Reranker's",
     .meaning = "the `<Instruct>` of each candidate's prompt"},
    {.key = "reranker.prefix",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .text = "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
             "Query and the Instruct provided. Note that the answer can only be \"yes\" or "
             "\"no\".<|im_end|>\n<|im_start|>user\n",
     .shown = "Qwen3-Reranker's",
     .meaning = "the text before `<Instruct>: …\\n<Query>: …\\n<Document>: …`"},
    {.key = "reranker.suffix",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .text = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
     .shown = "Qwen3-Reranker's",
     .meaning = "the text after it, up to the answer"},
    {.key = "reranker.yes_token",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .text = "yes",
     .meaning = "the positive answer; one token"},
    {.key = "reranker.no_token",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .text = "no",
     .meaning = "the negative answer; one token"},
    {.key = "reranker.max_positives",
     .task = "generative_reranker",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 64,
     .meaning = "positives kept per record, in record order, as ms-swift's"},
    {.key = "reranker.max_negatives",
     .task = "generative_reranker",
     .number = 7,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1024,
     .meaning = "negatives kept per record, in record order, as ms-swift's"},
    {.key = "reranker.eval_path",
     .task = "generative_reranker",
     .default_kind = SpecDefault::kText,
     .shown = "none",
     .meaning = "held-out reranker records, ranked before step 1, every `eval_every` steps and "
                "at the end"},
    {.key = "reranker.eval_every",
     .task = "generative_reranker",
     .number = 0,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "0..max_steps",
     .meaning = "steps between evaluations; 0 evaluates at the end only"},
    {.key = "block_diffusion.block_length",
     .task = "block_diffusion",
     .default_kind = SpecDefault::kRequired,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "1..data.seq_len / 2",
     .meaning = "tokens per block"},
    {.key = "block_diffusion.mask_token_id",
     .task = "block_diffusion",
     .default_kind = SpecDefault::kDerived,
     .shown = "config.json's `mask_token_id`, else the tokenizer's `<|MASK|>`",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "a token id, >= 0",
     .meaning = "the mask token, in the vocabulary"},
    {.key = "block_diffusion.eps",
     .task = "block_diffusion",
     .number = 1e-3,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1e-12,
     .hi = 1,
     .hi_open = true,
     .meaning = "the floor of the masking probability"},
    {.key = "moe.aux_loss",
     .moe_only = true,
     .default_kind = SpecDefault::kText,
     .text = "global",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "global, micro_batch",
     .meaning = "the tokens the load-balancing loss counts expert shares and router "
                "probabilities over: all of the optimizer step's, over micro-batches and ranks "
                "(global-batch balancing), or each forward's own, as transformers"},
    {.key = "moe.aux_loss_scope",
     .moe_only = true,
     .default_kind = SpecDefault::kText,
     .text = "all_layers",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "all_layers, per_layer",
     .meaning = "one loss over the MoE layers' routings concatenated (transformers), or the mean "
                "of per-layer losses (Megatron)"},
    {.key = "moe.balance",
     .moe_only = true,
     .default_kind = SpecDefault::kText,
     .text = "aux_loss",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "aux_loss, aux_free",
     .meaning = "the load-balancing loss added to the objective, or DeepSeek-V3's "
                "auxiliary-loss-free balancing: a per-expert bias on the router's top-k choice, "
                "moved against each expert's load after every step (docs/moe-balancing.md)"},
    {.key = "moe.aux_free_rate",
     .moe_only = true,
     .default_kind = SpecDefault::kDerived,
     .shown = "0.001 under `aux_free`",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "(0, 1], with balance aux_free",
     .meaning = "how far each step moves an expert's bias (DeepSeek-V3's γ)"},
    {.key = "moe.router_aux_loss_coef",
     .moe_only = true,
     .default_kind = SpecDefault::kDerived,
     .shown = "config.json's `router_aux_loss_coef`; 0 under `aux_free`",
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 100,
     .meaning = "the load-balancing loss's coefficient"},
    {.key = "moe.expert_parallel",
     .moe_only = true,
     .number = 0,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "0 or 1 (off), or the ranks ZeRO-3 shards over (devices; sharding.shard_group "
                "under hybrid), dividing num_experts",
     .meaning = "experts split over the ranks, whole experts on each; routed tokens travel to "
                "them over an all-to-all instead of the experts being gathered "
                "(see [docs/scaling.md](docs/scaling.md))"},
    {.key = "optimizer.lr",
     .default_kind = SpecDefault::kRequired,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .lo_open = true,
     .meaning = "peak learning rate"},
    {.key = "optimizer.weight_decay",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .hi_open = true,
     .meaning = "AdamW's decoupled decay"},
    {.key = "optimizer.beta1",
     .number = 0.9,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .hi_open = true,
     .meaning = "AdamW's first-moment decay (torch.optim.AdamW semantics)"},
    {.key = "optimizer.beta2",
     .number = 0.999,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .hi_open = true,
     .meaning = "AdamW's second-moment decay"},
    {.key = "optimizer.eps",
     .number = 1e-8,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1e-2,
     .lo_open = true,
     .meaning = "AdamW's denominator epsilon"},
    {.key = "optimizer.max_grad_norm",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1e6,
     .lo_open = true,
     .zero_off = true,
     .meaning = "clip by the global grad_norm"},
    {.key = "schedule.kind",
     .default_kind = SpecDefault::kText,
     .text = "constant",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "constant, linear, cosine",
     .meaning = "learning-rate schedule; linear and cosine go to 0 at max_steps, as in "
                "transformers"},
    {.key = "schedule.warmup_steps",
     .number = 0,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "0..max_steps",
     .meaning = "linear warmup from 0"},
    {.key = "max_steps",
     .default_kind = SpecDefault::kRequired,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 1e9,
     .meaning = "optimizer steps"},
    {.key = "precision",
     .default_kind = SpecDefault::kText,
     .text = "fp32",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "fp32, bf16",
     .meaning = "bf16: bf16 compute and activations over fp32 master weights; the frozen weights "
                "are kept in bf16; gradients are reduced, and grad_norm and the loss are summed, "
                "in fp32 or wider"},
    {.key = "device",
     .default_kind = SpecDefault::kText,
     .text = "auto",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "auto, cpu, cuda",
     .meaning = "`cuda` is the GPU the worker gives the rank (fails at start, exit 2, saying "
                "what it found when there is none); `auto` is cuda when the rank sees a GPU; the "
                "coordinator places `cuda` and `cpu` jobs on workers of that kind only"},
    {.key = "gradient_checkpointing",
     .number = 0,
     .meaning = "recompute each decoder layer in backward"},
    {.key = "checkpoint_every",
     .number = 0,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "0..max_steps",
     .meaning = "steps between checkpoints; 0 writes only the final one"},
    {.key = "seed", .number = 0, .meaning = "data order, LoRA init, dropout"},
    {.key = "devices",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 1024,
     .meaning = "trainer ranks, each holding 1/N of the model (see Multi-rank jobs): all CUDA "
                "GPUs or all CPU slots, on one worker or several; more than the cluster's "
                "largest gang is refused at submission ([docs/control-plane.md]"
                "(docs/control-plane.md), \"Gangs\")"},
    {.key = "guard.max_consecutive_bad",
     .number = 3,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1000,
     .meaning = "bad steps in a row (non-finite, or no supervised token) before a rollback; 0 "
                "never (see Guard)"},
    {.key = "guard.max_rollbacks",
     .number = 3,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 100,
     .meaning = "rollbacks a job may take before it fails with a diagnosis"},
    {.key = "guard.spike_window",
     .number = 50,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 8,
     .hi = 10000,
     .meaning = "healthy steps a spike is measured against; no spike is judged before that many"},
    {.key = "guard.loss_spike_zscore",
     .number = 6,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 3,
     .hi = 1000,
     .zero_off = true,
     .meaning = "robust z-score above which a loss is a spike"},
    {.key = "guard.grad_norm_spike_zscore",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 3,
     .hi = 1000,
     .zero_off = true,
     .meaning = "the same for grad_norm, which moves by orders of magnitude in healthy runs"},
    {.key = "guard.collapse_window",
     .number = 200,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 100000,
     .meaning = "steps in a row of a loss below collapse_loss, of a constant grad_norm, or of a "
                "router collapse (`moe_collapse_share`), that make a collapse; 0 off"},
    {.key = "guard.collapse_loss",
     .number = 1e-4,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .meaning = "the loss below which a step counts towards a collapse"},
    {.key = "guard.moe_collapse_share",
     .number = 0.9,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0.5,
     .hi = 1,
     .hi_open = true,
     .zero_off = true,
     .meaning = "router collapse (MoE models): `collapse_window` steps in a row in which some "
                "layer's k most loaded experts take more than this share of its routed "
                "(token, choice) pairs; 0 off"},
    {.key = "guard.min_applied_fraction",
     .number = 0.5,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .meaning = "the least share of max_steps that must be applied (not skipped) for a run to "
                "succeed; it fails at its end naming the causes (see Guard); a run with no "
                "applied step fails even at 0"},
    {.key = "guard.snapshot_every",
     .number = 10,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1000000,
     .meaning = "steps between in-memory snapshots; 0 off; each costs 3 × the trainable fp32 "
                "bytes of host memory"},
    {.key = "guard.snapshots",
     .number = 2,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 16,
     .meaning = "snapshots the ring keeps"},
    {.key = "guard.good_after_steps",
     .number = 10,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1000000,
     .meaning = "clean applied steps after a snapshot or checkpoint before it counts as good"},
    {.key = "guard.rerun_bad_step",
     .number = 1,
     .meaning = "re-run a non-finite or spiking step once to tell a transient fault from a "
                "deterministic one"},
    {.key = "guard.lr_cut",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1,
     .lo_open = true,
     .meaning = "LR multiplier after a rollback; 1 leaves the LR alone"},
    {.key = "guard.rewarm_steps",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 1000000,
     .meaning = "steps over which the cut LR rises back to 1; 0: it stays"},
    {.key = "guard.inject",
     .default_kind = SpecDefault::kDerived,
     .shown = "none",
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "steps 1..max_steps (a step to run), on_rank 0..devices-1 (a rank of the job)",
     .meaning = "fault injection for tests and demos (see Guard)"},
    {.key = "keep_checkpoints",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 10000,
     .meaning = "checkpoints kept on disk, the newest good one always among them; 0 keeps all"},
    {.key = "report_to",
     .default_kind = SpecDefault::kText,
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "tensorboard",
     .meaning = "where rank 0 also reports the run: `tensorboard` writes loss, grad_norm, lr, "
                "tokens/s and the guard's events to `<output folder>/tensorboard/` (see "
                "TensorBoard); empty: metrics.jsonl and the job's events only"},
    {.key = "scheduling.priority",
     .number = 0,
     .allowed_kind = SpecAllowed::kRange,
     .lo = -1000,
     .hi = 1000,
     .meaning = "higher runs first, then submission order (coordinator only)"},
    {.key = "scheduling.max_restarts",
     .number = 3,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 0,
     .hi = 100,
     .meaning = "restarts from the last checkpoint after a rank or worker failure"},
    {.key = "watchdog.stall_factor",
     .number = 10,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 1000,
     .lo_open = true,
     .zero_default = true,
     .meaning = "the job is stalled, its ranks stopped and it restarts from its newest "
                "checkpoint (a restart), when no rank completes a step for this many times the "
                "median step time, and at least `stall_floor_s` (coordinator only; see "
                "[docs/reliability.md](docs/reliability.md), \"Watchdog\"); 0: the default"},
    {.key = "watchdog.stall_floor_s",
     .number = 120,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 86400,
     .zero_default = true,
     .meaning = "the least wait before a stall, in seconds: room for checkpoints, evaluations "
                "and slow first steps; 0: the default"},
    {.key = "watchdog.straggler_factor",
     .number = 2,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 1000,
     .lo_open = true,
     .zero_default = true,
     .meaning = "a rank whose own time in a step (outside collectives) stays above this many "
                "times the median of the other ranks' is a straggler (an event and "
                "`ballast_rank_straggler`); 0: the default"},
    {.key = "watchdog.straggler_window",
     .number = 20,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 100000,
     .zero_default = true,
     .meaning = "steps in a row a rank must be slow to become a straggler, and fast again to "
                "stop being one; 0: the default"},
    {.key = "sharding.strategy",
     .default_kind = SpecDefault::kText,
     .text = "zero3",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "hybrid, zero3",
     .meaning = "`zero3`: parameters, gradients and optimizer state sharded across all ranks; "
                "`hybrid` (HSDP): sharded inside shard groups of `shard_group` ranks on one "
                "worker each, replicated across groups, gradients allreduced across the replicas "
                "(see [docs/scaling.md](docs/scaling.md))"},
    {.key = "sharding.shard_group",
     .number = 0,
     .allowed_kind = SpecAllowed::kInCode,
     .allowed = "1..devices, dividing devices (hybrid only)",
     .meaning = "ranks per shard group under `hybrid`; required there, unset otherwise"},
    {.key = "zero3.prefetch",
     .number = 1,
     .allowed_kind = SpecAllowed::kRange,
     .lo = 1,
     .hi = 16,
     .zero_default = true,
     .meaning = "units whose parameter all-gather may be in flight ahead of the one computing; "
                "more hides more latency at a unit's parameters of memory each; 0: the default"},
    {.key = "zero3.reduce_dtype",
     .default_kind = SpecDefault::kText,
     .text = "fp32",
     .allowed_kind = SpecAllowed::kOneOf,
     .choices = "bf16, fp32",
     .meaning = "the dtype gradients travel in during reduce-scatter; `bf16` (needs `precision: "
                "bf16`) halves those bytes, and the sum stays fp32"},
};

// The rule of `key`, or nullptr.
constexpr const SpecRule* FindSpecRule(absl::string_view key) {
  for (const SpecRule& rule : kSpecRules) {
    if (rule.key == key) return &rule;
  }
  return nullptr;
}

// The default of a number or bool key, at compile time; a key without one
// does not compile.
consteval double SpecDefaultNumber(absl::string_view key) {
  const SpecRule* rule = FindSpecRule(key);
  if (rule == nullptr || rule->default_kind != SpecDefault::kNumber) {
    throw "not a spec key with a number default";
  }
  return rule->number;
}

// The default of a string key, at compile time.
consteval absl::string_view SpecDefaultText(absl::string_view key) {
  const SpecRule* rule = FindSpecRule(key);
  if (rule == nullptr || rule->default_kind != SpecDefault::kText) {
    throw "not a spec key with a text default";
  }
  return rule->text;
}

// The fields along each rule's key, from ballast.v1.JobSpec down, in
// kSpecRules' order (built once). A key that names no field is a bug that
// spec_rules_test catches: its path is empty.
const std::vector<std::vector<const google::protobuf::FieldDescriptor*>>& SpecFieldPaths();

// The allowed values in words, as errors and the README say them: "1..4096"
// for an integer field, "(0, 1]" for a real one, "0 (off) or [3, 1000]",
// "full, lora" (sorted) for a choice, or the rule's `allowed`; empty for kAny.
std::string SpecAllowedText(const SpecRule& rule);

// The README's "Job spec" table, in Markdown: key, default, allowed, meaning.
std::string SpecTableMarkdown();

// The lines around the table in README.md.
inline constexpr absl::string_view kSpecTableBegin =
    "<!-- spec table: generated from common/spec_rules.h; run build/bin/ballast_spec_table "
    "README.md to update it -->";
inline constexpr absl::string_view kSpecTableEnd = "<!-- end of spec table -->";

// `readme` with SpecTableMarkdown() between kSpecTableBegin and
// kSpecTableEnd; INVALID_ARGUMENT when it lacks either line.
absl::StatusOr<std::string> WithSpecTable(absl::string_view readme);

}  // namespace ballast

#endif  // BALLAST_COMMON_SPEC_RULES_H_
