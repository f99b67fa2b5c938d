// The files a tenant uploads for fine-tuning through the OpenAI-compatible
// API (POST /v1/files, docs/openai-api.md): each kept under ballastd's
// output root, in the tenant's own folder (TenantUploadFolder), where every
// worker sees it as it sees the jobs' folders, with a record of its name,
// size, purpose and SHA-256 beside it. A file is checked before it is kept:
// chat JSONL, one {"messages": [...]} record per line, as OpenAI documents
// for supervised fine-tuning. A tenant finds only its own files; another's
// id is NOT_FOUND, as an id that does not exist. Thread-safe: a file and its
// record are written to temporary names and renamed into place, record last.
#ifndef BALLAST_SERVER_UPLOAD_STORE_H_
#define BALLAST_SERVER_UPLOAD_STORE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ballast::server {

// The largest upload, by default: 100 MiB (ballastd --openai-max-file-bytes).
inline constexpr uint64_t kDefaultMaxUploadBytes = uint64_t{100} << 20;

struct UploadedFile {
  // "file-" and 24 hex digits.
  std::string id;
  std::string filename;
  // "fine-tune", the one purpose taken.
  std::string purpose;
  int64_t bytes = 0;
  // Unix seconds.
  int64_t created_at = 0;
  // Hex.
  std::string sha256;
  // Its non-blank lines: the chats it holds.
  int64_t records = 0;
  // Where it lies, absolute: what a job's data.path names.
  std::string path;
};

class UploadStore {
 public:
  // `output_root` is ballastd's, absolute.
  explicit UploadStore(std::string output_root) : output_root_(std::move(output_root)) {}

  // Checks and keeps a file of `tenant`. INVALID_ARGUMENT for another
  // purpose, or a file that CheckChatJsonl refuses, with *bad_param the
  // request field at fault ("purpose", "file"); INTERNAL when it cannot be
  // written.
  absl::StatusOr<UploadedFile> Save(const std::string& tenant, const std::string& filename,
                                    const std::string& purpose, absl::string_view data,
                                    std::string* bad_param) const;

  // NOT_FOUND for an id that is not one of `tenant`'s files.
  absl::StatusOr<UploadedFile> Find(const std::string& tenant, const std::string& id) const;

  // What a job made from an upload was asked for (the API's JobOrigin, as
  // text), kept in the tenant's folder beside its files; `job_id` is the
  // coordinator's. Load is NOT_FOUND for a job with none (one submitted
  // over gRPC).
  absl::Status SaveJobOrigin(const std::string& tenant, const std::string& job_id,
                             absl::string_view text) const;
  absl::StatusOr<std::string> LoadJobOrigin(const std::string& tenant,
                                            const std::string& job_id) const;

 private:
  std::string FolderOf(const std::string& tenant) const;
  const std::string output_root_;
};

// OK when every non-blank line of `data` is a chat record: a JSON object
// whose "messages" is a non-empty array of {"role", "content"} objects, role
// system, developer, user, assistant or tool, content a string, at least
// one assistant message. INVALID_ARGUMENT naming the first bad line (from
// 1) otherwise, or for a file with no record. *records gets the count.
absl::Status CheckChatJsonl(absl::string_view data, int64_t* records);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_UPLOAD_STORE_H_
