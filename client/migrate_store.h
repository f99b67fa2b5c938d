// `ballast migrate-store FROM TO [--allow-non-empty]`: copies a coordinator's
// store, SQLite to PostgreSQL or back, and checks the copy
// (server/store_migration.h).
//
// The command runs `ballastd migrate-store` in this process's place. The store
// code is ballastd's (server/), with the SQLite and libpq libraries it links;
// `ballast` is a gRPC client that neither links them nor reads a store, so
// that it installs on any machine that reaches a coordinator. A migration
// runs where the store is, beside ballastd, and the coordinator image ships
// both binaries in one folder.
#ifndef BALLAST_CLIENT_MIGRATE_STORE_H_
#define BALLAST_CLIENT_MIGRATE_STORE_H_

#include <string>
#include <vector>

#include "client/commands.h"

namespace ballast::client {

// Executes the ballastd in this executable's folder, else the one on PATH,
// with `migrate-store` and `args`; returns (exit 1, saying so on io.err) only
// when neither can be executed.
int MigrateStore(const Io& io, const std::vector<std::string>& args);

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_MIGRATE_STORE_H_
