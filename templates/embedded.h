// templates/embedded.h: the CUDA templates of templates/, embedded at build time.
#ifndef FUSEJIT_TEMPLATES_EMBEDDED_H_
#define FUSEJIT_TEMPLATES_EMBEDDED_H_

#include <span>
#include <string_view>

namespace fusejit::templates {

struct TemplateFile {
  std::string_view name;  // file name, e.g. "common.cuh"; also its #include name
  std::string_view text;  // verbatim contents
};

// Every template, sorted by name.
std::span<const TemplateFile> All();

// The template named `name`, or nullptr.
const TemplateFile* Find(std::string_view name);

// 12 hex digits of SHA-256 over every template and the planner's sources (codegen/), computed
// at build time: builds whose kernels or plans may differ have different digests.
std::string_view GeneratorDigest();

}  // namespace fusejit::templates

#endif  // FUSEJIT_TEMPLATES_EMBEDDED_H_
