// The controller's status page (controller/status_page.html, compiled in):
// one self-contained HTML file that polls /api/status.
#ifndef BATON_CONTROLLER_STATUS_PAGE_H_
#define BATON_CONTROLLER_STATUS_PAGE_H_

#include <string>

namespace baton {

const std::string& StatusPageHtml();

}  // namespace baton

#endif  // BATON_CONTROLLER_STATUS_PAGE_H_
