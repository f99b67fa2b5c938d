// Idempotency keys for SubmitJob.
#ifndef BALLAST_CLIENT_REQUEST_ID_H_
#define BALLAST_CLIENT_REQUEST_ID_H_

#include <string>

namespace ballast::client {

// A random UUID version 4 in its 36-character text form, from
// std::random_device; a new one on every call.
std::string NewRequestId();

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_REQUEST_ID_H_
