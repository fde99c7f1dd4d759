// SPDX-License-Identifier: MIT
// Reading profile files (device, WAN) and a WAN profile's deck overrides.
#include "atlas/sim/profile.hpp"

#include "atlas/deck/deck.hpp"

namespace atlas::sim {

DeviceProfile load_device_profile(const std::string& path) {
  return parse_device_profile(path, deck::read_text_file(path, deck::kMaxDeckBytes, "device profile"));
}

WanProfile load_wan_profile(const std::string& path) {
  return parse_wan_profile(path, deck::read_text_file(path, deck::kMaxDeckBytes, "WAN profile"));
}

std::vector<std::string> wan_profile_overrides(const std::string& wan_path, const std::string& deck_path,
                                               const std::vector<std::string>& overrides) {
  const WanProfile wan = load_wan_profile(wan_path);
  // Only the DC names are needed; the caller validates the deck with the matrices set.
  const Config names = deck::parse(deck_path, deck::read_text_file(deck_path), overrides);
  return wan.deck_overrides(names.cluster.dcs);
}

}  // namespace atlas::sim
