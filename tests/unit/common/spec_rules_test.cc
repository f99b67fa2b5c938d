#include "common/spec_rules.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"

namespace ballast {
namespace {

using google::protobuf::FieldDescriptor;
using ::testing::HasSubstr;

TEST(SpecRules, EveryKeyNamesAFieldOnce) {
  std::set<absl::string_view> keys;
  for (size_t i = 0; i < std::size(kSpecRules); ++i) {
    EXPECT_FALSE(SpecFieldPaths()[i].empty()) << kSpecRules[i].key << " names no JobSpec field";
    EXPECT_TRUE(keys.insert(kSpecRules[i].key).second) << kSpecRules[i].key << " twice";
  }
}

// Every field a user can write has a row in the README: its own rule, or
// its message's (guard.inject).
void ExpectRules(const google::protobuf::Descriptor* message, const std::string& prefix) {
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* f = message->field(i);
    const std::string key = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (FindSpecRule(key) != nullptr) continue;
    if (f->message_type() != nullptr) {
      ExpectRules(f->message_type(), key);
    } else {
      ADD_FAILURE() << key << " has no rule in common/spec_rules.h";
    }
  }
}

TEST(SpecRules, EveryFieldHasARule) { ExpectRules(v1::JobSpec::descriptor(), ""); }

// A default of the wrong type would be set as something else, and a non-zero
// default on a field without presence would overwrite a user's explicit 0.
TEST(SpecRules, DefaultsFitTheirFields) {
  for (size_t i = 0; i < std::size(kSpecRules); ++i) {
    const SpecRule& rule = kSpecRules[i];
    if (SpecFieldPaths()[i].empty()) continue;
    const FieldDescriptor* f = SpecFieldPaths()[i].back();
    if (rule.default_kind == SpecDefault::kNumber) {
      EXPECT_NE(f->cpp_type(), FieldDescriptor::CPPTYPE_STRING) << rule.key;
      EXPECT_NE(f->cpp_type(), FieldDescriptor::CPPTYPE_MESSAGE) << rule.key;
      EXPECT_FALSE(f->is_repeated()) << rule.key;
      if (rule.number != 0 && !rule.zero_default) {
        EXPECT_TRUE(f->has_presence()) << rule.key << " needs `optional`";
      }
      if (rule.zero_default) EXPECT_FALSE(f->has_presence()) << rule.key << ": use `optional`";
    }
    if (rule.default_kind == SpecDefault::kText) {
      EXPECT_EQ(f->cpp_type(), FieldDescriptor::CPPTYPE_STRING) << rule.key;
    }
    if (rule.allowed_kind == SpecAllowed::kRange) {
      EXPECT_LT(rule.lo, rule.hi) << rule.key;
      if (rule.default_kind == SpecDefault::kNumber) {
        const double v = rule.number;
        const bool inside =
            (rule.zero_off && v == 0) || ((rule.lo_open ? v > rule.lo : v >= rule.lo) &&
                                          (rule.hi_open ? v < rule.hi : v <= rule.hi));
        EXPECT_TRUE(inside) << rule.key << "'s default " << v << " is outside "
                            << SpecAllowedText(rule);
      }
    }
  }
}

TEST(SpecRules, AllowedTextIsWrittenAsAPersonWould) {
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("lora.r")), "1..4096");
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("max_steps")), "1..10^9");
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("guard.snapshot_every")), "0..1000000");
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("lora.lora_alpha")), "(0, 1e6]");
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("optimizer.eps")), "(0, 1e-2]");
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("lora.lora_dropout")), "[0, 1)");
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("guard.loss_spike_zscore")), "0 (off) or [3, 1000]");
  EXPECT_EQ(SpecAllowedText(*FindSpecRule("method")), "full, lora");
}

// Each default reaches a spec through ApplyDefaults, and each range through
// ValidateJobSpec's error.
TEST(SpecRules, ApplyDefaultsAndValidateJobSpecReadTheRules) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
      "model: {path: m}\ndata: {path: d, seq_len: 8}\noptimizer: {lr: 0.1}\nmax_steps: 3\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyDefaults(&*spec);
  EXPECT_EQ(spec->lora().r(), SpecDefaultNumber("lora.r"));
  EXPECT_EQ(spec->guard().collapse_window(), SpecDefaultNumber("guard.collapse_window"));
  EXPECT_EQ(spec->schedule().kind(), SpecDefaultText("schedule.kind"));
  ASSERT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
  spec->mutable_guard()->set_spike_window(7);
  EXPECT_EQ(ValidateJobSpec(*spec).message(),
            "guard.spike_window = 7 is out of range; allowed: 8..10000");
}

std::string ReadReadme() {
  const char* root = std::getenv("BALLAST_SOURCE_DIR");
  if (root == nullptr) return "";
  std::stringstream text;
  text << std::ifstream(std::string(root) + "/README.md").rdbuf();
  return text.str();
}

// The README's table is ballast_spec_table's output: a default, a range or a
// meaning changed in the rules and not in the README (or the other way
// round) fails here.
TEST(SpecRules, ReadmeTableIsTheRulesTable) {
  const std::string readme = ReadReadme();
  ASSERT_FALSE(readme.empty()) << "run through ctest, which sets BALLAST_SOURCE_DIR";
  absl::StatusOr<std::string> expected = WithSpecTable(readme);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(*expected == readme)
      << "README.md's job spec table differs from common/spec_rules.h; run "
         "build/bin/ballast_spec_table README.md. The table:\n"
      << SpecTableMarkdown();
}

TEST(SpecRules, ReadmeWithoutTheMarkersIsRefused) {
  absl::StatusOr<std::string> updated = WithSpecTable("# Ballast\n| key | default |\n");
  EXPECT_EQ(updated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(updated.status().message(), HasSubstr("around the spec table"));
}

}  // namespace
}  // namespace ballast
