// The dashboard's files (server/dashboard/), compiled into ballastd by
// cmake/EmbedFiles.cmake: plain HTML, CSS and JavaScript, no build step and
// nothing fetched from the network.
#ifndef BALLAST_SERVER_DASHBOARD_ASSETS_H_
#define BALLAST_SERVER_DASHBOARD_ASSETS_H_

#include <string_view>
#include <vector>

namespace ballast::server {

struct DashboardAsset {
  const char* path;          // "/", "/dashboard.js", ...
  const char* content_type;  // with charset
  std::string_view body;
};

// Every file, "/" first.
const std::vector<DashboardAsset>& DashboardAssets();

}  // namespace ballast::server

#endif  // BALLAST_SERVER_DASHBOARD_ASSETS_H_
