# trnflow_embed(TARGET_VAR OUTPUT_CPP NAMESPACE FILES...) turns text files into a C++ source
# that defines `const std::vector<EmbeddedFile>& <namespace>::Files()`, sorted by file name,
# so SQL and catalog data ship inside the binary and are re-embedded when they change.
set(TRNFLOW_EMBED_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/embed_run.cmake)

function(trnflow_embed out_cpp ns)
  set(files ${ARGN})
  list(SORT files)
  add_custom_command(
    OUTPUT ${out_cpp}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out_cpp} -DNS=${ns} "-DFILES=${files}"
            -P ${TRNFLOW_EMBED_SCRIPT}
    DEPENDS ${files} ${TRNFLOW_EMBED_SCRIPT}
    COMMENT "Embedding ${ns}"
    VERBATIM)
endfunction()
