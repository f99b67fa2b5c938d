// The Authenticator over a real SQLite store: who a bearer secret is, what a
// revoked or forged one gets, and that the store never holds a secret.
#include "server/authenticator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

class AuthenticatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Authenticator> Open(const std::string& bootstrap) {
    auto store = Store::Open("sqlite:" + path());
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto auth = Authenticator::Create(store_.get(), bootstrap, [this] { return ++now_ms_; });
    EXPECT_TRUE(auth.ok()) << auth.status();
    return std::move(*auth);
  }
  std::string path() const { return (dir_.path() / "ballastd.db").string(); }

  static v1::CreateTokenRequest Request(v1::Role role, const std::string& tenant,
                                        const std::string& worker_id = "") {
    v1::CreateTokenRequest r;
    r.set_role(role);
    r.set_tenant(tenant);
    r.set_worker_id(worker_id);
    return r;
  }

  TempDir dir_;
  int64_t now_ms_ = 1000;
  std::unique_ptr<Store> store_;
};

TEST_F(AuthenticatorTest, OpenMeansEveryCallerIsTheDefaultAdminAndNoTokensAreMade) {
  auto auth = Open("");
  absl::StatusOr<Principal> who = auth->Authenticate("");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(who->role, v1::ROLE_ADMIN);
  EXPECT_EQ(who->tenant, kDefaultTenant);
  EXPECT_EQ(who->JobScope(), "");
  auto made = auth->CreateToken(Request(v1::ROLE_USER, "team-a"));
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(made.status().message(), HasSubstr("BALLAST_TOKEN"));
}

TEST_F(AuthenticatorTest, TokensNameTheirTenantAndRoleAndSurviveARestart) {
  std::string user_secret, worker_secret;
  {
    auto auth = Open("boot");
    EXPECT_EQ(auth->Authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(auth->Authenticate("Bearer wrong").status().code(),
              absl::StatusCode::kUnauthenticated);
    ASSERT_EQ(auth->Authenticate("Bearer boot")->role, v1::ROLE_ADMIN);
    auto user = auth->CreateToken(Request(v1::ROLE_USER, "team-a"));
    ASSERT_TRUE(user.ok()) << user.status();
    user_secret = user->secret();
    EXPECT_THAT(user_secret, ::testing::StartsWith(user->token().id() + "."));
    auto worker = auth->CreateToken(Request(v1::ROLE_WORKER, "", "node-7"));
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_secret = worker->secret();
  }
  auto auth = Open("boot");
  absl::StatusOr<Principal> user = auth->Authenticate("Bearer " + user_secret);
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(user->role, v1::ROLE_USER);
  EXPECT_EQ(user->JobScope(), "team-a");
  absl::StatusOr<Principal> worker = auth->Authenticate("Bearer " + worker_secret);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->role, v1::ROLE_WORKER);
  EXPECT_EQ(worker->worker_id, "node-7");
  // The right id with another key is a forgery.
  std::string forged = user_secret;
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_EQ(auth->Authenticate("Bearer " + forged).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth->ListTokens().tokens_size(), 2);
}

TEST_F(AuthenticatorTest, TheStoreHoldsOnlyAHashOfEachSecret) {
  auto auth = Open("boot");
  auto user = auth->CreateToken(Request(v1::ROLE_USER, "team-a"));
  ASSERT_TRUE(user.ok());
  const std::string key = user->secret().substr(user->secret().find('.') + 1);
  store_.reset();  // closes the database, so the file holds everything
  std::ifstream in(path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_THAT(bytes, HasSubstr(user->token().id()));
  EXPECT_EQ(bytes.find(key), std::string::npos);
}

TEST_F(AuthenticatorTest, ARevokedTokenStopsWorkingAtOnce) {
  auto auth = Open("boot");
  auto user = auth->CreateToken(Request(v1::ROLE_USER, "team-a"));
  ASSERT_TRUE(user.ok());
  ASSERT_TRUE(auth->Authenticate("Bearer " + user->secret()).ok());
  absl::StatusOr<v1::Token> revoked = auth->RevokeToken(user->token().id());
  ASSERT_TRUE(revoked.ok());
  EXPECT_GT(revoked->revoked_ms(), 0);
  absl::StatusOr<Principal> who = auth->Authenticate("Bearer " + user->secret());
  EXPECT_EQ(who.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(who.status().message(), HasSubstr("revoked"));
  EXPECT_EQ(auth->RevokeToken("tok-0000000000000000").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AuthenticatorTest, BadFieldsAreRefusedByName) {
  auto auth = Open("boot");
  EXPECT_THAT(auth->CreateToken(Request(v1::ROLE_USER, "Team A")).status().message(),
              HasSubstr("tenant: 'Team A'"));
  EXPECT_THAT(auth->CreateToken(Request(v1::ROLE_USER, "")).status().message(),
              HasSubstr("tenant"));
  EXPECT_THAT(auth->CreateToken(Request(v1::ROLE_WORKER, "")).status().message(),
              HasSubstr("worker_id"));
  EXPECT_THAT(auth->CreateToken(Request(v1::ROLE_WORKER, "team-a", "n1")).status().message(),
              HasSubstr("a worker token has none"));
  EXPECT_THAT(auth->CreateToken(Request(v1::ROLE_UNSPECIFIED, "team-a")).status().message(),
              HasSubstr("role"));
  EXPECT_EQ(auth->ListTokens().tokens_size(), 0);
}

}  // namespace
}  // namespace ballast::server
