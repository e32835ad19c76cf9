# fusejit_embed_templates(OUT_CC FILES... [DIGEST_FILES ...]): writes OUT_CC, a C++ file holding each CUDA
# template verbatim as a raw string literal (no timestamps, so builds are reproducible), and
# regenerates it whenever a template changes.
# DIGEST_FILES (absolute paths, after the keyword): more sources covered by the generator's
# digest (templates::GeneratorDigest), which also changes whenever one of them does.
function(fusejit_embed_templates out_cc)
  cmake_parse_arguments(ARG "" "" "DIGEST_FILES" ${ARGN})
  set(deps)
  foreach(f ${ARG_UNPARSED_ARGUMENTS})
    list(APPEND deps ${CMAKE_CURRENT_SOURCE_DIR}/${f})
  endforeach()
  add_custom_command(
    OUTPUT ${out_cc}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out_cc} "-DFILES=${deps}" "-DDIGEST_FILES=${ARG_DIGEST_FILES}"
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedTemplatesScript.cmake
    DEPENDS ${deps} ${ARG_DIGEST_FILES} ${PROJECT_SOURCE_DIR}/cmake/EmbedTemplatesScript.cmake
    COMMENT "Embedding CUDA templates"
    VERBATIM)
endfunction()
