"""meshshard.models"""
