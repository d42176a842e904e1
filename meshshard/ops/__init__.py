"""meshshard.ops"""
