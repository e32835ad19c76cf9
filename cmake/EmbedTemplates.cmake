# fusejit_embed_templates(TARGET OUT_CC FILES...): writes OUT_CC, a C++ file holding each CUDA
# template verbatim as a raw string literal (no timestamps, so builds are reproducible), and
# regenerates it whenever a template changes.
function(fusejit_embed_templates out_cc)
  set(deps)
  foreach(f ${ARGN})
    list(APPEND deps ${CMAKE_CURRENT_SOURCE_DIR}/${f})
  endforeach()
  add_custom_command(
    OUTPUT ${out_cc}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out_cc} "-DFILES=${deps}"
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedTemplatesScript.cmake
    DEPENDS ${deps} ${PROJECT_SOURCE_DIR}/cmake/EmbedTemplatesScript.cmake
    COMMENT "Embedding CUDA templates"
    VERBATIM)
endfunction()
