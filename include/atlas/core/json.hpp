// SPDX-License-Identifier: MIT
// The two pieces of JSON the result files need: a string's inside, and a number that may not be
// finite (JSON has no nan or inf: null).
#pragma once

#include <string>

namespace atlas::json {

/// `text` as the inside of a JSON string: quotes, backslashes and control characters escaped.
[[nodiscard]] std::string escape(const std::string& text);

/// `v` with `decimals` decimals, or null when it is not finite.
[[nodiscard]] std::string number(double v, int decimals);

}  // namespace atlas::json
