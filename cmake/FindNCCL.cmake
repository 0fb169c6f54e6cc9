# FindNCCL: nccl.h and libnccl, looked for under NCCL_ROOT, CUDAToolkit_ROOT
# and /usr/local/cuda (libnccl.so, or libnccl.so.2 alone as the nvidia-nccl pip
# wheels ship it). Defines NCCL_FOUND, NCCL_VERSION and the target NCCL::nccl.
find_path(NCCL_INCLUDE_DIR nccl.h
          HINTS ${NCCL_ROOT} ${CUDAToolkit_ROOT} /usr/local/cuda ENV NCCL_ROOT
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
             HINTS ${NCCL_ROOT} ${CUDAToolkit_ROOT} /usr/local/cuda ENV NCCL_ROOT
             PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)
if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_major REGEX "^#define NCCL_MAJOR")
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_minor REGEX "^#define NCCL_MINOR")
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_patch REGEX "^#define NCCL_PATCH")
  string(REGEX MATCH "[0-9]+" _nccl_major "${_nccl_major}")
  string(REGEX MATCH "[0-9]+" _nccl_minor "${_nccl_minor}")
  string(REGEX MATCH "[0-9]+" _nccl_patch "${_nccl_patch}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
