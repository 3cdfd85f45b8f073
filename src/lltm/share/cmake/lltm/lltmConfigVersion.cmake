# The version of lltm's CMake package: the Python package's, read from
# lltm/_version.py (the one statement of it). A request is met by the same
# version, or a newer one of the same minor release while lltm is 0.x (of the
# same major release from 1.0 on); EXACT by the same version only.

get_filename_component(_lltm_version_file "${CMAKE_CURRENT_LIST_DIR}/../../../_version.py" ABSOLUTE)
file(STRINGS "${_lltm_version_file}" _lltm_version_line REGEX "^__version__ *= *")
string(REGEX REPLACE "^__version__ *= *[\"']([^\"']*)[\"'].*" "\\1" PACKAGE_VERSION "${_lltm_version_line}")
unset(_lltm_version_file)
unset(_lltm_version_line)

set(PACKAGE_VERSION_COMPATIBLE FALSE)
set(PACKAGE_VERSION_EXACT FALSE)
if(NOT PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
elseif(PACKAGE_VERSION VERSION_EQUAL PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  set(PACKAGE_VERSION_EXACT TRUE)
elseif(PACKAGE_VERSION VERSION_GREATER PACKAGE_FIND_VERSION)
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _lltm_have "${PACKAGE_VERSION}")
  set(_lltm_have_major "${CMAKE_MATCH_1}")
  set(_lltm_have_minor "${CMAKE_MATCH_2}")
  if(_lltm_have_major STREQUAL PACKAGE_FIND_VERSION_MAJOR
     AND (NOT _lltm_have_major STREQUAL "0" OR _lltm_have_minor STREQUAL PACKAGE_FIND_VERSION_MINOR))
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
  unset(_lltm_have)
  unset(_lltm_have_major)
  unset(_lltm_have_minor)
endif()

# A 64-bit library: a 32-bit build cannot use it.
if(CMAKE_SIZEOF_VOID_P AND NOT CMAKE_SIZEOF_VOID_P EQUAL 8)
  set(PACKAGE_VERSION "${PACKAGE_VERSION} (64-bit)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
