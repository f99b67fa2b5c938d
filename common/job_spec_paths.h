// The paths a job spec names (model.path, lora.init_adapter, data.path,
// data.tokenizer, reranker.eval_path, eval.path) and where they may point.
//
// ballastd checks them at submission and ranks open them later, in other
// working folders, so a path must be absolute: the CLI and ballast-train
// make relative ones absolute against the folder they run in, and
// ValidateJobSpecFiles refuses one that is still relative. A coordinator
// with path roots (ballastd --path-root DIR, repeatable) also confines them
// to those folders once symlinks and ".." are resolved, and so the files in
// the model, adapter, tokenizer and data folders too. Without roots any path is
// allowed, as before roots existed. Thread-safe.
#ifndef BALLAST_COMMON_JOB_SPEC_PATHS_H_
#define BALLAST_COMMON_JOB_SPEC_PATHS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast {

// Most entries a model, adapter, tokenizer or data folder may hold when roots are
// set: each is resolved at submission (a model folder has a few dozen).
inline constexpr int kMaxFolderEntries = 4096;

// Makes each relative path of `spec` absolute against `base`, an absolute
// folder; absolute and empty paths stay as they are.
void MakeSpecPathsAbsolute(const std::string& base, v1::JobSpec* spec);

// As above, against the process's working folder. INTERNAL when that
// cannot be read (it was removed).
absl::Status MakeSpecPathsAbsolute(v1::JobSpec* spec);

// Replaces each path of `spec` with where it leads now, its symlinks and
// ".." resolved as far as it exists. A rank does this once CheckSpecPaths has
// passed, so that the paths it opens lie under the roots as written, which
// is what ConfineOpensBeneath (common/regular_file.h) holds them to.
void ResolveSpecPaths(v1::JobSpec* spec);

// OK when every root is an absolute path to an existing folder; otherwise
// INVALID_ARGUMENT naming it. ballastd checks its --path-root flags here.
absl::Status CheckPathRoots(const std::vector<std::string>& roots);

// OK when every path of `spec` is absolute and, when `roots` is not empty,
// lies under one of them after symlinks and ".." are resolved, as does each
// entry of the model, adapter, tokenizer and data folders. INVALID_ARGUMENT names
// the field, the path and the roots. Reads only directory entries and
// symlinks; call before any file is opened.
absl::Status CheckSpecPaths(const v1::JobSpec& spec, const std::vector<std::string>& roots);

// OK when no path of `spec`, nor an entry of its model, adapter, tokenizer or data
// folder, lies in ballastd's `output_root` other than in the folder of a job
// for which `may_read(job_id)` is true (the submitter's tenant's jobs), once
// symlinks and ".." are resolved. Otherwise INVALID_ARGUMENT, in the same
// words whether the job is another tenant's or does not exist. Without it,
// one tenant could train on another's export by naming its folder.
absl::Status CheckPathsOutsideOtherJobs(const v1::JobSpec& spec, const std::string& output_root,
                                        const std::function<bool(const std::string&)>& may_read);

// The folder in ballastd's output root that holds `tenant`'s uploaded files
// (the OpenAI-compatible API's /v1/files): "uploads-TENANT", a name no job
// id takes ("job-..."). A tenant's specs may read its own, as its job
// folders (the coordinator's may_read above).
std::string TenantUploadFolder(const std::string& tenant);

// OK when a run writing into `out_dir` cannot write over what it reads:
// `out_dir` is not any input path nor inside one (a model folder given as
// --out), and no input folder (model, adapter, tokenizer, data) lies inside
// `out_dir`, where a run's export and checkpoints would land on it. Data
// files inside the output folder are allowed: a run writes only its own
// names there. Both sides are compared once symlinks and ".." are resolved.
// INVALID_ARGUMENT names the field and both paths.
absl::Status CheckOutputApartFromInputs(const std::string& out_dir, const v1::JobSpec& spec);

}  // namespace ballast

#endif  // BALLAST_COMMON_JOB_SPEC_PATHS_H_
