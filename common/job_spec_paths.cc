#include "common/job_spec_paths.h"

#include <array>
#include <filesystem>
#include <functional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/regular_file.h"

namespace ballast {
namespace {

namespace fs = std::filesystem;

struct PathField {
  const char* name;
  const std::string& (*get)(const v1::JobSpec&);
  void (*set)(v1::JobSpec*, std::string);
  // May be a folder whose entries the trainer opens (a tokenizer or a data
  // set may be one, or a file).
  bool folder;
};

// Every path a spec names. The setters run only on a field that is set, so
// they never create an empty message (a set reranker is refused for
// another task).
constexpr std::array<PathField, 6> kPathFields = {{
    {"model.path", [](const v1::JobSpec& s) -> const std::string& { return s.model().path(); },
     [](v1::JobSpec* s, std::string p) { s->mutable_model()->set_path(std::move(p)); }, true},
    {"lora.init_adapter",
     [](const v1::JobSpec& s) -> const std::string& { return s.lora().init_adapter(); },
     [](v1::JobSpec* s, std::string p) { s->mutable_lora()->set_init_adapter(std::move(p)); },
     true},
    {"data.path", [](const v1::JobSpec& s) -> const std::string& { return s.data().path(); },
     [](v1::JobSpec* s, std::string p) { s->mutable_data()->set_path(std::move(p)); }, true},
    {"data.tokenizer",
     [](const v1::JobSpec& s) -> const std::string& { return s.data().tokenizer(); },
     [](v1::JobSpec* s, std::string p) { s->mutable_data()->set_tokenizer(std::move(p)); }, true},
    {"reranker.eval_path",
     [](const v1::JobSpec& s) -> const std::string& { return s.reranker().eval_path(); },
     [](v1::JobSpec* s, std::string p) { s->mutable_reranker()->set_eval_path(std::move(p)); },
     true},
    {"eval.path", [](const v1::JobSpec& s) -> const std::string& { return s.eval().path(); },
     [](v1::JobSpec* s, std::string p) { s->mutable_eval()->set_path(std::move(p)); }, true},
}};

// `path` with its symlinks and ".." resolved as far as it exists.
fs::path Resolved(const fs::path& path) {
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(path, ec);
  return ec ? path.lexically_normal() : resolved;
}

// OK when `path` resolves under one of `roots` (canonical folders).
absl::Status CheckUnderRoots(const std::string& field, const fs::path& path,
                             const std::vector<fs::path>& roots,
                             const std::vector<std::string>& given_roots) {
  const fs::path resolved = Resolved(path);
  for (const fs::path& root : roots) {
    if (IsPathUnder(resolved, root)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", path.string(),
      resolved == path ? "" : absl::StrCat(" (which resolves to ", resolved.string(), ")"),
      " is outside the path roots ", absl::StrJoin(given_roots, ", "),
      "; ballastd --path-root sets them"));
}

// Calls `check` on each set path of `spec` and, for a folder, on each of its
// entries: a folder that passes may still hold a link that leads elsewhere
// (config.json -> /etc/...). Stops at the first error.
absl::Status CheckPathsAndEntries(
    const v1::JobSpec& spec,
    const std::function<absl::Status(const std::string& field, const fs::path& path)>& check) {
  for (const PathField& f : kPathFields) {
    const std::string& value = f.get(spec);
    if (value.empty()) continue;
    if (absl::Status s = check(f.name, value); !s.ok()) return s;
    std::error_code ec;
    if (!f.folder || !fs::is_directory(value, ec)) continue;
    int entries = 0;
    const std::string entry_field = absl::StrCat(f.name, " entry");
    for (fs::directory_iterator it(value, ec), end; !ec && it != end; it.increment(ec)) {
      if (++entries > kMaxFolderEntries) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.name, ": ", value, " holds more than ", kMaxFolderEntries, " entries"));
      }
      if (absl::Status s = check(entry_field, it->path()); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

void MakeSpecPathsAbsolute(const std::string& base, v1::JobSpec* spec) {
  for (const PathField& f : kPathFields) {
    const std::string& value = f.get(*spec);
    if (value.empty() || fs::path(value).is_absolute()) continue;
    f.set(spec, (fs::path(base) / value).lexically_normal().string());
  }
}

absl::Status MakeSpecPathsAbsolute(v1::JobSpec* spec) {
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(
        "cannot read the working folder to resolve the spec's relative paths: ", ec.message()));
  }
  MakeSpecPathsAbsolute(cwd.string(), spec);
  return absl::OkStatus();
}

void ResolveSpecPaths(v1::JobSpec* spec) {
  for (const PathField& f : kPathFields) {
    const std::string& value = f.get(*spec);
    if (!value.empty()) f.set(spec, Resolved(value).string());
  }
}

absl::Status CheckPathRoots(const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    std::error_code ec;
    if (!fs::path(root).is_absolute() || !fs::is_directory(root, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--path-root ", root, ": not an absolute path to an existing folder"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSpecPaths(const v1::JobSpec& spec, const std::vector<std::string>& given_roots) {
  for (const PathField& f : kPathFields) {
    const std::string& value = f.get(spec);
    if (!value.empty() && !fs::path(value).is_absolute()) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.name, ": '", value,
          "' is relative; ballastd and the ranks run in other folders, so give an absolute path "
          "(ballast submit makes relative paths absolute against the folder it runs in)"));
    }
  }
  if (given_roots.empty()) return absl::OkStatus();
  std::vector<fs::path> roots;
  for (const std::string& root : given_roots) roots.push_back(Resolved(root));
  return CheckPathsAndEntries(spec, [&](const std::string& field, const fs::path& path) {
    return CheckUnderRoots(field, path, roots, given_roots);
  });
}

absl::Status CheckPathsOutsideOtherJobs(const v1::JobSpec& spec, const std::string& output_root,
                                        const std::function<bool(const std::string&)>& may_read) {
  if (output_root.empty()) return absl::OkStatus();
  const fs::path root = Resolved(output_root);
  return CheckPathsAndEntries(spec, [&](const std::string& field, const fs::path& path) {
    const fs::path resolved = Resolved(path);
    if (!IsPathUnder(resolved, root)) return absl::OkStatus();
    const fs::path relative = resolved.lexically_relative(root);
    const std::string job_id = relative.empty() ? "" : relative.begin()->string();
    if (!job_id.empty() && job_id != "." && may_read(job_id)) return absl::OkStatus();
    // The same words for another tenant's job and a missing one: the answer
    // must not tell which ids exist.
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path.string(), " lies in ballastd's output folder ", output_root,
        ", outside any job of yours; a job reads only its own tenant's job folders there"));
  });
}

std::string TenantUploadFolder(const std::string& tenant) {
  return absl::StrCat("uploads-", tenant);
}

absl::Status CheckOutputApartFromInputs(const std::string& out_dir, const v1::JobSpec& spec) {
  const fs::path out = Resolved(out_dir);
  for (const PathField& f : kPathFields) {
    const std::string& value = f.get(spec);
    if (value.empty()) continue;
    const fs::path input = Resolved(value);
    const bool out_in_input = IsPathUnder(out, input);
    std::error_code ec;
    if (!out_in_input && !(f.folder && fs::is_directory(input, ec) && IsPathUnder(input, out))) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the output folder ", out_dir, out_in_input ? " is inside " : " holds ", f.name, " ", value,
        ": a run writes its checkpoints and export there and would write over its own input; "
        "give an output folder apart from the inputs"));
  }
  return absl::OkStatus();
}

}  // namespace ballast
