#include "templates/embedded.h"

namespace fusejit::templates {

const TemplateFile* Find(std::string_view name) {
  for (const TemplateFile& f : All()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace fusejit::templates
