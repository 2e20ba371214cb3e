#include "controller/status_page.h"

namespace baton {

const std::string& StatusPageHtml() {
  static const std::string* const html = new std::string(
#include "controller/status_page.inc"
  );
  return *html;
}

}  // namespace baton
