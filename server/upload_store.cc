#include "server/upload_store.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/job_spec_paths.h"
#include "common/regular_file.h"
#include "server/crypto.h"

namespace ballast::server {
namespace {

namespace fs = std::filesystem;

constexpr char kPurpose[] = "fine-tune";
// A record holds a file's name and numbers: a few hundred bytes.
constexpr int64_t kMaxRecordBytes = 64 * 1024;

bool IsRole(const std::string& role) {
  return role == "system" || role == "developer" || role == "user" || role == "assistant" ||
         role == "tool";
}

// Why `line` is no chat record; empty when it is one.
std::string ChatRecordProblem(absl::string_view line) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) return "not valid JSON";
  if (!record.is_object()) return "not a JSON object";
  const auto messages = record.find("messages");
  if (messages == record.end() || !messages->is_array() || messages->empty()) {
    return "no \"messages\" array with at least one message";
  }
  bool assistant = false;
  for (size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::json& m = (*messages)[i];
    const auto role = m.is_object() ? m.find("role") : m.end();
    if (!m.is_object() || role == m.end() || !role->is_string() ||
        !IsRole(role->get<std::string>())) {
      return absl::StrCat("messages[", i,
                          "] has no role among system, developer, user, assistant, tool");
    }
    const auto content = m.find("content");
    if (content == m.end() || !content->is_string()) {
      return absl::StrCat("messages[", i, "] has no string \"content\"");
    }
    assistant |= role->get<std::string>() == "assistant";
  }
  if (!assistant) return "no assistant message: nothing to train on";
  return "";
}

// Writes `data` to a temporary name beside `path`, then renames it there.
absl::Status WriteInPlace(const fs::path& path, absl::string_view data) {
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", partial.string()));
  }
  std::error_code ec;
  fs::rename(partial, path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", partial.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

bool IsFileId(absl::string_view id) {
  if (id.size() != 29 || id.substr(0, 5) != "file-") return false;
  for (char c : id.substr(5)) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckChatJsonl(absl::string_view data, int64_t* records) {
  *records = 0;
  int64_t number = 0;
  for (absl::string_view line : absl::StrSplit(data, '\n')) {
    ++number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (std::string problem = ChatRecordProblem(line); !problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, " of the file is not a chat record: ", problem,
                       "; each line must be {\"messages\": [{\"role\": ..., \"content\": ...}, "
                       "...]}"));
    }
    ++*records;
  }
  if (*records == 0) {
    return absl::InvalidArgumentError("the file holds no chat record (every line is blank)");
  }
  return absl::OkStatus();
}

std::string UploadStore::FolderOf(const std::string& tenant) const {
  return (fs::path(output_root_) / TenantUploadFolder(tenant)).string();
}

absl::StatusOr<UploadedFile> UploadStore::Save(const std::string& tenant,
                                               const std::string& filename,
                                               const std::string& purpose, absl::string_view data,
                                               std::string* bad_param) const {
  if (purpose != kPurpose) {
    *bad_param = "purpose";
    return absl::InvalidArgumentError(absl::StrCat(
        "purpose '", absl::CHexEscape(purpose.substr(0, 64)), "': only 'fine-tune' is taken"));
  }
  UploadedFile file;
  if (absl::Status s = CheckChatJsonl(data, &file.records); !s.ok()) {
    *bad_param = "file";
    return s;
  }
  file.id = absl::StrCat("file-", RandomHex(12));
  // The name is the client's: kept for the record, never used as a path.
  file.filename = filename.substr(0, 255);
  file.purpose = purpose;
  file.bytes = static_cast<int64_t>(data.size());
  file.created_at = absl::ToUnixSeconds(absl::Now());
  file.sha256 = absl::BytesToHexString(Sha256(data));
  const fs::path folder = FolderOf(tenant);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot make ", folder.string(), ": ", ec.message()));
  }
  file.path = (folder / (file.id + ".jsonl")).string();
  if (absl::Status s = WriteInPlace(file.path, data); !s.ok()) return s;
  const nlohmann::json record = {
      {"id", file.id},          {"filename", file.filename},     {"purpose", file.purpose},
      {"bytes", file.bytes},    {"created_at", file.created_at}, {"sha256", file.sha256},
      {"records", file.records}};
  if (absl::Status s =
          WriteInPlace(folder / (file.id + ".json"),
                       record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      !s.ok()) {
    return s;
  }
  return file;
}

absl::StatusOr<UploadedFile> UploadStore::Find(const std::string& tenant,
                                               const std::string& id) const {
  const absl::Status not_found = absl::NotFoundError(
      absl::StrCat("no file ", absl::CHexEscape(id.substr(0, 64)), " (uploaded by your tenant)"));
  // Only an id of ours becomes a path: never '..' or a '/'.
  if (!IsFileId(id)) return not_found;
  const fs::path folder = FolderOf(tenant);
  absl::StatusOr<std::string> text =
      ReadRegularFile((folder / (id + ".json")).string(), kMaxRecordBytes);
  if (absl::IsNotFound(text.status())) return not_found;
  if (!text.ok()) return text.status();
  const nlohmann::json record = nlohmann::json::parse(*text, nullptr, false);
  UploadedFile file;
  try {
    file.id = record.at("id").get<std::string>();
    file.filename = record.at("filename").get<std::string>();
    file.purpose = record.at("purpose").get<std::string>();
    file.bytes = record.at("bytes").get<int64_t>();
    file.created_at = record.at("created_at").get<int64_t>();
    file.sha256 = record.at("sha256").get<std::string>();
    file.records = record.at("records").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(absl::StrCat("the record of file ", id, " is damaged: ", e.what()));
  }
  file.path = (folder / (id + ".jsonl")).string();
  return file;
}

absl::Status UploadStore::SaveJobOrigin(const std::string& tenant, const std::string& job_id,
                                        absl::string_view text) const {
  const fs::path folder = fs::path(FolderOf(tenant)) / "jobs";
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot make ", folder.string(), ": ", ec.message()));
  }
  return WriteInPlace(folder / (job_id + ".json"), text);
}

absl::StatusOr<std::string> UploadStore::LoadJobOrigin(const std::string& tenant,
                                                       const std::string& job_id) const {
  return ReadRegularFile((fs::path(FolderOf(tenant)) / "jobs" / (job_id + ".json")).string(),
                         kMaxRecordBytes);
}

}  // namespace ballast::server
