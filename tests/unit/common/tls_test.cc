// TLS flags that cannot work are refused by name before anything listens.
#include "common/tls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace ballast {
namespace {

using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ballast-tls-XXXXXX";
    dir_ = mkdtemp(pattern);
    std::ofstream(dir_ / "not.pem") << "hello\n";
    std::ofstream(dir_ / "fake.pem") << "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
  }
  void TearDown() override {
    for (const char* f : {"not.pem", "fake.pem"}) std::filesystem::remove(dir_ / f);
    std::filesystem::remove(dir_);
  }
  std::string Path(const char* name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(TlsTest, NoFilesIsPlainTcpAtBothEnds) {
  EXPECT_TRUE(GrpcServerCredentials({}, "--tls-").ok());
  EXPECT_TRUE(GrpcChannelCredentials({}, "--tls-").ok());
}

TEST_F(TlsTest, ACertificateWithoutItsKeyIsRefusedNamingTheFlag) {
  auto server = GrpcServerCredentials({.cert = Path("fake.pem")}, "--tls-");
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--tls-key: required with --tls-cert"));
  auto client = GrpcChannelCredentials({.key = Path("fake.pem")}, "--tls-");
  EXPECT_THAT(client.status().message(), HasSubstr("--tls-cert: required with --tls-key"));
  // A server with only a client CA has nothing to present.
  EXPECT_THAT(GrpcServerCredentials({.ca = Path("fake.pem")}, "--tls-").status().message(),
              HasSubstr("a server needs both"));
}

TEST_F(TlsTest, MissingAndNonPemFilesAreRefusedNamingTheFlagAndPath) {
  auto missing = GrpcChannelCredentials({.ca = Path("absent.pem")}, "--tls-");
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-ca " + Path("absent.pem")));
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot be read"));
  auto text = GrpcChannelCredentials({.ca = Path("not.pem")}, "--tls-");
  EXPECT_THAT(text.status().message(), HasSubstr("not PEM"));
  auto client_ca = GrpcServerCredentials(
      {.cert = Path("fake.pem"), .key = Path("fake.pem"), .ca = Path("not.pem")}, "--tls-");
  EXPECT_THAT(client_ca.status().message(), HasSubstr("--tls-client-ca"));
}

}  // namespace
}  // namespace ballast
