#include "worker/train/shard/sharded_model.h"

#include <torch/torch.h>

#include <algorithm>

#include "worker/train/collectives/step_phase.h"
#include "worker/train/model/activation_checkpoint.h"
#include "worker/train/model/rng_state.h"

namespace ballast::train {

struct ShardedModel::Bucket {
  const FlatBucket* plan = nullptr;
  // Frozen buckets: this rank's elements, in the compute dtype. (Trainable
  // ones keep theirs in masters_.)
  at::Tensor frozen_shard;
  // The gathered bucket, (padded) in the compute dtype; a leaf that requires
  // grad when trainable. Its storage is allocated only while gathered, and
  // every view the decoder or autograd took of it sees the data again when
  // it is gathered back.
  at::Tensor flat;
  // What a gather in flight reads and writes; `target` shares flat's storage
  // under its own version counter, so that writing the gathered data does not
  // look like an in-place change to the tensors autograd saved.
  at::Tensor source, target;
  std::unique_ptr<InFlight> in_flight;
  bool gathered = false;
  // Expert parallelism: `flat` is this rank's shard alone, copied, not
  // gathered, and its gradient is already the whole step's.
  bool resident = false;
};

struct ShardedModel::Unit {
  int64_t layer = ParamStore::kNoLayer;
  std::vector<size_t> buckets;
  std::vector<int64_t> bucket_offsets;  // bytes, from the unit's start in its slab
  int64_t bytes = 0;                    // the unit's gathered buckets
  int64_t base = 0;                     // bytes: where the unit starts in its slab
  int slab = -1;                        // the slab it is gathered into; -1 none
};

struct ShardedModel::PendingReduction {
  size_t bucket;
  at::Tensor full, shard;
  std::unique_ptr<InFlight> in_flight;
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Points t's storage at memory of a slab the model owns.
void SetStorage(const at::Tensor& t, uint8_t* memory) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(memory, t.device()));
  impl->set_nbytes(t.numel() * t.element_size());
}

// Buckets start on cache lines in their slab.
int64_t AlignUp(int64_t n) { return (n + 63) / 64 * 64; }

void FreeStorage(const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
}

void WaitFor(std::unique_ptr<InFlight>& in_flight) {
  if (in_flight) in_flight->Wait();
  in_flight.reset();
}

// One layer of a sharded model. Its inputs are h and the layer's trainable
// flat buffers: the buffers are passed so that autograd runs this node's
// backward even when h needs no gradient (frozen embeddings under LoRA);
// their gradients go to the gradient shards, not back through autograd.
struct ShardedLayerFunction : public torch::autograd::Function<ShardedLayerFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, at::TensorList flats,
                            ShardedModel* model, const Decoder* decoder, int64_t layer,
                            const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& cu_seqlens, int64_t mask_kind, int64_t block_size) {
    const size_t unit = model->LayerUnit(layer);
    StepPhase::OfThisRank().Enter(StepPhase::Kind::kForward, static_cast<int32_t>(layer));
    model->WaitGathered(unit);
    model->PrefetchFrom(unit, +1);
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
    ctx->saved_data["decoder"] = reinterpret_cast<int64_t>(decoder);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["mask_kind"] = mask_kind;
    ctx->saved_data["block_size"] = block_size;
    ctx->saved_data["num_flats"] = static_cast<int64_t>(flats.size());
    ctx->saved_data["h_requires_grad"] = h.requires_grad();
    const kernels::AttentionMask mask = SavedAttentionMask(cu_seqlens, mask_kind, block_size);
    at::Tensor out;
    if (decoder->gradient_checkpointing()) {
      ctx->saved_data["rng"] = GeneratorState(h.device());
      ctx->save_for_backward({h, cos, sin, cu_seqlens});
      torch::NoGradGuard no_grad;
      out = decoder->LayerForward(layer, h, cos, sin, mask, /*training=*/true);
    } else {
      // The layer's own graph, kept until backward; its saved weights are
      // views of buffers that Release() empties and backward refills.
      torch::AutoGradMode enable(true);
      at::Tensor h_leaf = h.detach().requires_grad_(h.requires_grad());
      at::Tensor graph_out = decoder->LayerForward(layer, h_leaf, cos, sin, mask, true);
      ctx->saved_data["h_leaf"] = h_leaf;
      ctx->saved_data["graph_out"] = graph_out;
      out = graph_out.detach();
    }
    model->Release(unit);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* model = reinterpret_cast<ShardedModel*>(ctx->saved_data["model"].toInt());
    const auto* decoder = reinterpret_cast<const Decoder*>(ctx->saved_data["decoder"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const int64_t num_flats = ctx->saved_data["num_flats"].toInt();
    const bool h_requires_grad = ctx->saved_data["h_requires_grad"].toBool();
    const size_t unit = model->LayerUnit(layer);
    StepPhase::OfThisRank().Enter(StepPhase::Kind::kBackward, static_cast<int32_t>(layer));
    model->WaitGathered(unit);
    model->PrefetchFrom(unit, -1);

    at::Tensor h_leaf, graph_out;
    if (decoder->gradient_checkpointing()) {
      variable_list saved = ctx->get_saved_variables();
      const at::Tensor rng_now = GeneratorState(saved[0].device());
      SetGeneratorState(ctx->saved_data["rng"].toTensor(), saved[0].device());
      h_leaf = saved[0].detach().requires_grad_(h_requires_grad);
      {
        torch::AutoGradMode enable(true);
        const kernels::AttentionMask mask = SavedAttentionMask(
            saved[3], ctx->saved_data["mask_kind"].toInt(), ctx->saved_data["block_size"].toInt());
        graph_out = decoder->LayerForward(layer, h_leaf, saved[1], saved[2], mask, true);
      }
      SetGeneratorState(rng_now, saved[0].device());
    } else {
      h_leaf = ctx->saved_data["h_leaf"].toTensor();
      graph_out = ctx->saved_data["graph_out"].toTensor();
    }

    const std::vector<at::Tensor> flats = model->TrainableFlats(unit);
    variable_list inputs;
    if (h_requires_grad) inputs.push_back(h_leaf);
    inputs.insert(inputs.end(), flats.begin(), flats.end());
    variable_list grads = torch::autograd::grad({graph_out}, inputs, {grad_out[0]},
                                                /*retain_graph=*/false, /*create_graph=*/false,
                                                /*allow_unused=*/true);
    ctx->saved_data.erase("graph_out");
    ctx->saved_data.erase("h_leaf");
    model->ReduceGradients(
        unit, std::vector<at::Tensor>(grads.begin() + (h_requires_grad ? 1 : 0), grads.end()));
    model->Release(unit);

    // One gradient per forward input: h, each flat buffer (theirs went to the
    // shards), then model, decoder, layer, cos, sin, cu_seqlens and the mask's
    // structure, which get none.
    variable_list result;
    result.push_back(h_requires_grad ? grads[0] : at::Tensor());
    for (int64_t i = 0; i < num_flats; ++i) result.push_back(at::Tensor());
    for (int i = 0; i < 8; ++i) result.push_back(at::Tensor());
    return result;
  }
};

}  // namespace

ShardedModel::ShardedModel(ParamStore full, Collectives* collectives, at::ScalarType compute_dtype,
                           c10::Device device, Zero3Options options)
    : collectives_(&collectives->shard_group()),
      replicas_(collectives->replica_group()),
      compute_dtype_(compute_dtype),
      options_(options),
      device_(device),
      layout_(FlatLayout::Plan(full, collectives_->world_size())) {
  TORCH_CHECK(options_.prefetch >= 1, "ShardedModel: prefetch ", options_.prefetch, " is below 1");
  torch::NoGradGuard no_grad;
  const int n = collectives_->world_size();
  const int rank = collectives_->rank();
  std::map<std::string, size_t> unit_index;
  for (const FlatBucket& plan : layout_.buckets) {
    auto bucket = std::make_unique<Bucket>();
    bucket->plan = &plan;
    // This rank's elements of the bucket: the tensors' flat concatenation,
    // zero past the end, from rank * S.
    const int64_t s = plan.shard_numel(n);
    const int64_t begin = rank * s;
    const at::ScalarType dtype = plan.trainable ? torch::kFloat : compute_dtype_;
    at::Tensor shard = torch::zeros({s}, torch::TensorOptions().dtype(dtype).device(device_));
    for (const FlatEntry& e : plan.entries) {
      const int64_t lo = std::max(begin, e.offset), hi = std::min(begin + s, e.offset + e.numel);
      if (lo >= hi) continue;
      full.CopyFlatRange(e.name, lo - e.offset, shard.narrow(0, lo - begin, hi - lo));
    }
    for (const FlatEntry& e : plan.entries) {
      // Placeholders until the unit is first gathered.
      gathered_.Add(e.name, torch::empty({0}, device_), plan.layer, plan.trainable);
    }
    if (plan.trainable) {
      masters_.Add(plan.key(), shard, plan.layer, /*trainable=*/true);
    } else {
      bucket->frozen_shard = shard;
    }
    bucket->resident = options_.expert_parallel && plan.experts();
    if (bucket->resident) {
      TORCH_CHECK(plan.entries[0].shape[0] % n == 0, "ShardedModel: ", plan.entries[0].shape[0],
                  " experts of ", plan.experts_tensor, " do not split over ", n, " ranks");
    }
    bucket->flat = torch::empty({bucket->resident ? s : plan.padded},
                                torch::TensorOptions().dtype(compute_dtype_).device(device_));
    FreeStorage(bucket->flat);
    if (plan.trainable) bucket->flat.set_requires_grad(true);

    auto [it, added] = unit_index.emplace(plan.unit, units_.size());
    if (added) {
      units_.push_back(Unit{plan.layer, {}});
      if (plan.layer == ParamStore::kNoLayer) {
        root_units_.push_back(it->second);
      } else {
        if (layer_units_.size() <= static_cast<size_t>(plan.layer)) {
          layer_units_.resize(plan.layer + 1);
        }
        layer_units_[plan.layer] = it->second;
      }
    }
    units_[it->second].buckets.push_back(buckets_.size());
    buckets_.push_back(std::move(bucket));
  }
  // Slabs: the roots' one, and 1 + prefetch a layer can take (the one
  // computing and those prefetched). Reusing them keeps the gathered buffers, the
  // step's largest allocations, out of the heap, where allocating and
  // freeing them per layer fragments it until peak memory exceeds one rank's.
  int64_t roots = 0, largest_layer = 0;
  for (Unit& unit : units_) {
    for (size_t b : unit.buckets) {
      unit.bucket_offsets.push_back(unit.bytes);
      unit.bytes += AlignUp(buckets_[b]->flat.numel() * buckets_[b]->flat.element_size());
    }
    if (unit.layer == ParamStore::kNoLayer) {
      unit.base = roots;  // the roots share one slab, side by side
      roots += unit.bytes;
    } else {
      largest_layer = std::max(largest_layer, unit.bytes);
    }
  }
  const auto bytes = torch::TensorOptions().dtype(torch::kByte).device(device_);
  slabs_.push_back(torch::empty({roots}, bytes));
  for (int i = 0; i <= options_.prefetch; ++i) {
    slabs_.push_back(torch::empty({largest_layer}, bytes));
  }
  slab_taken_.assign(slabs_.size(), false);
  // `full` goes out of scope here: only the shards stay.
}

ShardedModel::~ShardedModel() = default;

size_t ShardedModel::LayerUnit(int64_t layer) const { return layer_units_.at(layer); }
size_t ShardedModel::num_units() const { return units_.size(); }
bool ShardedModel::IsLayer(size_t unit) const { return units_[unit].layer != ParamStore::kNoLayer; }

std::vector<at::Tensor> ShardedModel::TrainableFlats(size_t unit) const {
  std::vector<at::Tensor> out;
  for (size_t b : units_[unit].buckets) {
    if (buckets_[b]->plan->trainable) out.push_back(buckets_[b]->flat);
  }
  return out;
}

void ShardedModel::Gather(size_t unit) {
  torch::NoGradGuard no_grad;
  Unit& u = units_[unit];
  if (u.slab < 0) {
    if (u.layer == ParamStore::kNoLayer) {
      u.slab = 0;
    } else {
      for (size_t s = 1; s < slabs_.size() && u.slab < 0; ++s) {
        if (!slab_taken_[s]) u.slab = static_cast<int>(s);
      }
      TORCH_CHECK(u.slab > 0, "ShardedModel: more than 1 + prefetch = ", slabs_.size() - 1,
                  " layers gathered at once");
      slab_taken_[u.slab] = true;
    }
  }
  uint8_t* memory = slabs_[u.slab].data_ptr<uint8_t>() + u.base;
  for (size_t i = 0; i < u.buckets.size(); ++i) {
    Bucket& bucket = *buckets_[u.buckets[i]];
    if (bucket.gathered) continue;
    SetStorage(bucket.flat, memory + u.bucket_offsets[i]);
    bucket.target = torch::empty({0}, bucket.flat.options().requires_grad(false))
                        .set_(bucket.flat.storage(), 0, {bucket.flat.numel()}, {1});
    if (bucket.plan->trainable) {
      const at::Tensor& master = masters_.get(bucket.plan->key());
      bucket.source = master.scalar_type() == compute_dtype_ ? master.detach()
                                                             : master.detach().to(compute_dtype_);
    } else {
      bucket.source = bucket.frozen_shard;
    }
    if (bucket.resident) {
      bucket.target.copy_(bucket.source);
    } else {
      bucket.in_flight = collectives_->AllGather(bucket.target, bucket.source);
    }
    bucket.gathered = true;
  }
}

void ShardedModel::PrefetchFrom(size_t unit, int step, std::optional<size_t> bound) {
  for (int k = 1; k <= options_.prefetch; ++k) {
    const int64_t next = static_cast<int64_t>(unit) + k * step;
    if (next < 0 || next >= static_cast<int64_t>(units_.size()) || !IsLayer(next)) return;
    if (bound && (next - static_cast<int64_t>(*bound)) * step > 0) return;
    Gather(next);
  }
}

void ShardedModel::WaitGathered(size_t unit) {
  Gather(unit);
  for (size_t b : units_[unit].buckets) {
    Bucket& bucket = *buckets_[b];
    WaitFor(bucket.in_flight);
    bucket.source = at::Tensor();
    bucket.target = at::Tensor();
    // Views made with grad on, so that a trainable tensor's gradient reaches
    // the flat leaf.
    torch::AutoGradMode enable(true);
    for (const FlatEntry& e : bucket.plan->entries) {
      if (bucket.resident) {  // the one entry: this rank's experts of it
        std::vector<int64_t> shape = e.shape;
        shape[0] /= collectives_->world_size();
        gathered_.Rebind(e.name, bucket.flat.view(shape));
      } else {
        gathered_.Rebind(e.name, bucket.flat.narrow(0, e.offset, e.numel).view(e.shape));
      }
    }
  }
}

void ShardedModel::Release(size_t unit) {
  Unit& u = units_[unit];
  if (u.slab > 0) slab_taken_[u.slab] = false;
  u.slab = -1;
  for (size_t b : u.buckets) {
    Bucket& bucket = *buckets_[b];
    WaitFor(bucket.in_flight);
    bucket.source = at::Tensor();
    bucket.target = at::Tensor();
    if (bucket.gathered) FreeStorage(bucket.flat);
    bucket.gathered = false;
  }
}

void ShardedModel::ReduceGradients(size_t unit, const std::vector<at::Tensor>& flat_grads) {
  // At most `prefetch` units' reductions in flight: they overlap the next
  // layers' backward, and the full-size gradients never pile up.
  while (pending_.size() >= static_cast<size_t>(options_.prefetch)) FinishOldestReductions();
  torch::NoGradGuard no_grad;
  std::vector<PendingReduction>& reductions = pending_.emplace_back();
  size_t next = 0;
  for (size_t b : units_[unit].buckets) {
    if (!buckets_[b]->plan->trainable) continue;
    const at::Tensor& grad = flat_grads.at(next++);
    if (!grad.defined()) continue;
    PendingReduction p;
    p.bucket = b;
    if (buckets_[b]->resident) {  // every rank's rows for these experts came here
      p.shard = grad.to(torch::kFloat).contiguous();
      reductions.push_back(std::move(p));
      continue;
    }
    p.full = grad.to(options_.reduce_dtype).contiguous();
    p.shard = torch::empty({buckets_[b]->plan->shard_numel(collectives_->world_size())},
                           torch::TensorOptions().dtype(torch::kFloat).device(device_));
    p.in_flight = collectives_->ReduceScatter(p.shard, p.full);
    reductions.push_back(std::move(p));
  }
}

void ShardedModel::FinishOldestReductions() {
  torch::NoGradGuard no_grad;
  for (PendingReduction& p : pending_.front()) {
    WaitFor(p.in_flight);
    at::Tensor master = masters_.get(buckets_[p.bucket]->plan->key());
    if (master.grad().defined()) {
      master.mutable_grad().add_(p.shard);
    } else {
      master.mutable_grad() = p.shard;
    }
  }
  pending_.pop_front();
}

void ShardedModel::GatherRoots() {
  for (size_t u : root_units_) Gather(u);
  for (size_t u : root_units_) WaitGathered(u);
}

void ShardedModel::ReleaseRoots() {
  for (size_t u : root_units_) Release(u);
}

void ShardedModel::FinishBackward() {
  for (size_t u : root_units_) {
    std::vector<at::Tensor> grads;
    for (at::Tensor& flat : TrainableFlats(u)) {
      grads.push_back(flat.grad());
      flat.mutable_grad().reset();
    }
    ReduceGradients(u, grads);
  }
  while (!pending_.empty()) FinishOldestReductions();
  for (size_t u : root_units_) Release(u);
}

void ShardedModel::ReduceAcrossReplicas() {
  if (replicas_ == nullptr) return;
  torch::NoGradGuard no_grad;
  // One flat buffer: a collective per bucket would pay its latency as many
  // times, for shards of a few KiB under LoRA. A shard without a gradient
  // has none on any rank (ReduceGradients' reduce-scatters, which every rank
  // of a shard group issues alike, rely on the same) and stays without one,
  // as on one rank.
  std::vector<at::Tensor> shards;
  for (const std::string& key : masters_.names()) {
    const at::Tensor& grad = masters_.get(key).grad();
    if (grad.defined()) shards.push_back(grad);
  }
  if (shards.empty()) return;
  at::Tensor flat = torch::cat(shards);
  replicas_->SumInPlace(flat);
  int64_t offset = 0;
  for (at::Tensor& shard : shards) {
    shard.copy_(flat.narrow(0, offset, shard.numel()));
    offset += shard.numel();
  }
}

bool ShardedModel::counts_in_grad_norm() const {
  return replicas_ == nullptr || replicas_->rank() == 0;
}

at::Tensor ShardedModel::RunLayer(const Decoder& decoder, int64_t layer, const at::Tensor& h,
                                  const at::Tensor& cos, const at::Tensor& sin,
                                  const kernels::AttentionMask& mask, bool training) {
  const size_t unit = LayerUnit(layer);
  std::vector<at::Tensor> flats = TrainableFlats(unit);
  if (torch::GradMode::is_enabled() && (h.requires_grad() || !flats.empty())) {
    return ShardedLayerFunction::apply(h, at::TensorList(flats), this, &decoder, layer, cos, sin,
                                       mask.cu_seqlens, static_cast<int64_t>(mask.kind),
                                       mask.block_size);
  }
  at::Tensor out;
  WithLayer(layer, decoder.config().num_hidden_layers - 1,
            [&] { out = decoder.LayerForward(layer, h, cos, sin, mask, training); });
  return out;
}

void ShardedModel::WithLayer(int64_t layer, int64_t last, const std::function<void()>& forwards) {
  const size_t unit = LayerUnit(layer);
  WaitGathered(unit);
  PrefetchFrom(unit, +1, LayerUnit(last));
  forwards();
  Release(unit);
}

std::vector<std::pair<std::string, at::Tensor>> ShardedModel::GatherFullTensors(
    bool trainable_only) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const std::unique_ptr<Bucket>& bucket : buckets_) {
    const FlatBucket& plan = *bucket->plan;
    if (trainable_only && !plan.trainable) continue;
    at::Tensor source =
        plan.trainable ? masters_.get(plan.key()).detach() : bucket->frozen_shard.to(torch::kFloat);
    at::Tensor full =
        torch::empty({plan.padded}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    std::unique_ptr<InFlight> in_flight = collectives_->AllGather(full, source);
    WaitFor(in_flight);
    for (const FlatEntry& e : plan.entries) {
      out.emplace_back(e.name, full.narrow(0, e.offset, e.numel).view(e.shape));
    }
  }
  return out;
}

std::pair<std::vector<std::string>, at::Tensor> ShardedModel::GradSumSquaresByTensor() const {
  torch::NoGradGuard no_grad;
  const int n = collectives_->world_size();
  const int64_t rank = collectives_->rank();
  std::vector<std::string> names;
  std::vector<at::Tensor> sums;
  const at::Tensor zero =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  for (const FlatBucket& bucket : layout_.buckets) {
    if (!bucket.trainable) continue;
    const at::Tensor& grad = masters_.get(bucket.key()).grad();
    // This rank's elements of the bucket: [lo, lo + s).
    const int64_t s = bucket.shard_numel(n);
    const int64_t lo = rank * s;
    for (const FlatEntry& entry : bucket.entries) {
      names.push_back(entry.name);
      const int64_t from = std::max(lo, entry.offset);
      const int64_t to = std::min(lo + s, entry.offset + entry.numel);
      if (!grad.defined() || from >= to) {
        sums.push_back(zero);
        continue;
      }
      sums.push_back(grad.narrow(0, from - lo, to - from).to(torch::kDouble).square().sum());
    }
  }
  at::Tensor stacked = torch::stack(sums);
  if (!counts_in_grad_norm()) stacked.mul_(0);
  return {names, stacked};
}

int64_t ShardedModel::parameter_bytes() const {
  int64_t bytes = gradient_bytes();
  for (const std::unique_ptr<Bucket>& b : buckets_) {
    if (b->frozen_shard.defined()) bytes += b->frozen_shard.nbytes();
  }
  return bytes;
}

int64_t ShardedModel::gradient_bytes() const {
  int64_t bytes = 0;
  for (const std::string& name : masters_.names()) bytes += masters_.get(name).nbytes();
  return bytes;
}

int64_t ShardedModel::gathered_buffer_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& slab : slabs_) bytes += slab.nbytes();
  return bytes;
}

}  // namespace ballast::train
