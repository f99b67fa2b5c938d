// What the compiler says about the CUDA kernels, without a GPU: registers,
// stack, local memory and static shared memory of every kernel in the built
// libballast_kernels.a, per arch (cuobjdump --dump-resource-usage), and the
// dynamic shared memory of every attention tile variant (MakeSmemLayout, the
// function the launches use).
//
// Fails when a hot kernel (attention forward / dQ / dK-dV / Delta,
// cross-entropy tiles, grad_norm; bf16 / fp16 / fp32) has a stack frame or
// local memory, which is where register spills go. The threshold is 0
// bytes: none of them has any (the tile kernels' __launch_bounds__ lets
// ptxas use 128 registers; at its default of 64 the head-dim-256 and dK/dV
// variants spilled 8 to 24 bytes), and a spill inside the tile loops costs
// a local-memory round trip per iteration. Fails too when an attention variant needs more shared
// memory than its arch lets a block opt in to.
//
// With BALLAST_RESOURCES_TABLE=<file> it writes the markdown table
// (scripts/cuda-resources makes bench/results/cuda-resources.md this way).
// Skips, visibly, in a build without CUDA or without cuobjdump.
#include <cxxabi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_tiles.h"

namespace ballast::kernels {
namespace {

struct KernelUsage {
  int arch = 0;
  std::string name;  // demangled, without namespaces and parameters
  int registers = 0;
  int stack = 0;
  int shared = 0;  // static; on sm_90+ it includes the 1 KiB the system reserves per block
  int local = 0;
};

std::string Demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 ? std::string(out.get()) : mangled;
}

// "void a::(anonymous namespace)::Kernel<T, 1, 2>(a::Params)" -> "Kernel<T, 1, 2>".
std::string ShortName(const std::string& demangled) {
  std::string s = demangled;
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  // Cut the parameter list: the last '(' at template depth 0.
  int depth = 0;
  size_t params = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0 && s.compare(i, 11, "(anonymous ") != 0) {
      params = i;
      break;
    }
  }
  s = s.substr(0, params);
  // Drop the namespaces: the last "::" at depth 0.
  depth = 0;
  size_t start = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && s[i] == ':' && s[i + 1] == ':') start = i + 2;
  }
  return s.substr(start);
}

std::vector<KernelUsage> ParseResourceUsage(const std::string& text) {
  std::vector<KernelUsage> out;
  const std::regex arch_re(R"(arch = sm_(\d+))");
  const std::regex func_re(R"(^\s*Function ([^:]+):)");
  const std::regex usage_re(R"(REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+))");
  std::istringstream in(text);
  std::string line, function;
  int arch = 0;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, arch_re)) {
      arch = std::stoi(m[1]);
    } else if (std::regex_search(line, m, func_re)) {
      function = m[1];
    } else if (!function.empty() && std::regex_search(line, m, usage_re)) {
      out.push_back({arch, ShortName(Demangle(function)), std::stoi(m[1]), std::stoi(m[2]),
                     std::stoi(m[3]), std::stoi(m[4])});
      function.clear();
    }
  }
  return out;
}

// The hot kernels: every launch of a training step goes through one of them.
// The fp64 instantiations are not: they serve gradient checks, and fp64
// exp() may call a subroutine with a stack frame.
bool IsHot(const std::string& name) {
  if (name.find("double") != std::string::npos) return false;
  for (const char* hot : {"AttentionForwardKernel", "AttentionQueryGradKernel",
                          "AttentionKeyValueGradKernel", "AttentionDeltaKernel", "LseTileKernel",
                          "GradTileKernel", "chunk_sum_squares", "segment_sum"}) {
    if (name.rfind(hot, 0) == 0) return true;
  }
  return false;
}

// The dynamic shared memory an attention kernel variant asks for, from its
// template arguments <T, D, a, b>; -1 for other kernels.
int DynamicSmem(const std::string& name) {
  const std::regex args(R"(<[^,]+, (\d+), (\d+), (\d+)>)");
  std::smatch m;
  if (!std::regex_search(name, m, args)) return -1;
  const int d = std::stoi(m[1]), a = std::stoi(m[2]), b = std::stoi(m[3]);
  if (name.rfind("AttentionForwardKernel", 0) == 0) {
    return SmemBytes(AttentionPass::kForward, d, {a, b});
  }
  if (name.rfind("AttentionQueryGradKernel", 0) == 0) {
    return SmemBytes(AttentionPass::kQueryGrad, d, {a, b});
  }
  if (name.rfind("AttentionKeyValueGradKernel", 0) == 0) {  // <T, D, keys, queries>
    return SmemBytes(AttentionPass::kKeyValueGrad, d, {a, b});
  }
  return -1;
}

// sharedMemPerBlockOptin of the datacenter part of each arch the build targets.
int OptInLimit(int arch) { return arch >= 90 ? 227 * 1024 : 163 * 1024; }
// Shared memory cuobjdump counts in SHARED that the system reserves per block.
int Reserved(int arch) { return arch >= 90 ? 1024 : 0; }

std::string RunCommand(const std::string& cmd, int* status) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  *status = pclose(pipe);
  return out;
}

void WriteTable(const std::vector<KernelUsage>& usage, const std::string& path) {
  std::map<std::string, std::map<int, KernelUsage>> by_kernel;
  std::vector<int> archs;
  for (const KernelUsage& u : usage) {
    by_kernel[u.name][u.arch] = u;
    if (std::find(archs.begin(), archs.end(), u.arch) == archs.end()) archs.push_back(u.arch);
  }
  std::sort(archs.begin(), archs.end());
  std::ofstream out(path);
  out << "# CUDA kernel resources\n\n"
      << "Written by scripts/cuda-resources from `cuobjdump --dump-resource-usage` on "
         "libballast_kernels.a (no GPU involved) and, for the attention tile variants, the "
         "dynamic shared memory from MakeSmemLayout (kernels/attention_tiles.h), the function "
         "the launches use. Per arch: registers per thread / stack frame bytes / local memory "
         "bytes / static shared memory bytes (on sm_90 and later cuobjdump counts the 1 KiB the "
         "system reserves per block). Stack and local memory are where spills go; "
         "tests/unit/kernels/kernel_resources_test.cc fails when a hot kernel (marked *) has "
         "a stack frame or local memory, or when a variant's shared memory passes "
         "its arch's opt-in limit (163 KiB on "
         "sm_80, 227 KiB on sm_90 and sm_100).\n\n";
  out << "| kernel | dynamic smem |";
  for (int a : archs) out << " sm_" << a << " reg/stack/local/smem |";
  out << "\n|---|---|";
  for (size_t i = 0; i < archs.size(); ++i) out << "---|";
  out << "\n";
  for (const auto& [name, per_arch] : by_kernel) {
    const int dyn = DynamicSmem(name);
    out << "| `" << name << "`" << (IsHot(name) ? " *" : "") << " | "
        << (dyn >= 0
                ? std::to_string(dyn) + " (" + std::to_string(dyn / 1024.0).substr(0, 5) + " KiB)"
                : std::string("-"))
        << " |";
    for (int a : archs) {
      auto it = per_arch.find(a);
      if (it == per_arch.end()) {
        out << " - |";
        continue;
      }
      const KernelUsage& u = it->second;
      out << " " << u.registers << " / " << u.stack << " / " << u.local << " / " << u.shared
          << " |";
    }
    out << "\n";
  }
}

TEST(KernelResources, HotKernelsDoNotSpillAndTileVariantsFitTheirArch) {
#if !defined(BALLAST_WITH_CUDA) || !defined(BALLAST_KERNELS_LIB)
  GTEST_SKIP() << "built without CUDA kernels: no device code to inspect";
#else
  const char* env_tool = std::getenv("CUOBJDUMP");
  const std::string tool = env_tool != nullptr ? env_tool : BALLAST_CUOBJDUMP;
  if (tool.empty()) {
    GTEST_SKIP() << "no cuobjdump (set CUOBJDUMP, or install the CUDA toolkit's or triton's)";
  }
  int status = 0;
  const std::string text = RunCommand(
      "'" + tool + "' --dump-resource-usage '" + BALLAST_KERNELS_LIB + "' 2>&1", &status);
  ASSERT_EQ(status, 0) << tool << " failed:\n" << text;
  const std::vector<KernelUsage> usage = ParseResourceUsage(text);
  ASSERT_FALSE(usage.empty()) << "no kernels found in " << BALLAST_KERNELS_LIB << ":\n" << text;
  int hot = 0, variants = 0;
  for (const KernelUsage& u : usage) {
    const std::string what = "sm_" + std::to_string(u.arch) + " " + u.name;
    if (IsHot(u.name)) {
      ++hot;
      EXPECT_EQ(u.stack, 0) << what << " has a stack frame (spills)";
      EXPECT_EQ(u.local, 0) << what << " uses local memory (spills)";
    }
    const int dyn = DynamicSmem(u.name);
    if (dyn >= 0) {
      ++variants;
      EXPECT_LE(dyn + u.shared - Reserved(u.arch), OptInLimit(u.arch))
          << what << " needs more shared memory than sm_" << u.arch << " allows";
    }
  }
  EXPECT_GT(hot, 0);
  EXPECT_GT(variants, 0);
  if (const char* table = std::getenv("BALLAST_RESOURCES_TABLE")) WriteTable(usage, table);
#endif
}

TEST(KernelResources, ParsesCuobjdumpOutput) {
  const std::string text =
      "arch = sm_90\n"
      " Function "
      "_ZN7ballast7kernels14attention_cuda12_GLOBAL__N_122AttentionForwardKernelI13__nv_"
      "bfloat16Li128ELi64ELi32EEEvNS2_13ForwardParamsE:\n"
      "  REG:168 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:616 TEXTURE:0 SURFACE:0 SAMPLER:0\n";
  const std::vector<KernelUsage> usage = ParseResourceUsage(text);
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].arch, 90);
  EXPECT_EQ(usage[0].name, "AttentionForwardKernel<__nv_bfloat16, 128, 64, 32>");
  EXPECT_EQ(usage[0].registers, 168);
  EXPECT_EQ(usage[0].shared, 1024);
  EXPECT_TRUE(IsHot(usage[0].name));
  EXPECT_EQ(DynamicSmem(usage[0].name), SmemBytes(AttentionPass::kForward, 128, {64, 32}));
}

}  // namespace
}  // namespace ballast::kernels
